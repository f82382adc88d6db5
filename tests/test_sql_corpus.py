"""A SQL corpus for the front end: every supported construct compiles to the plan it means, and
every refused construct is a CompileError that names it.

Each case is data (id, dialect, SQL text, and what to expect). Valid cases state facts about the
logical plan (its shape, output columns, predicates, semantics, anchors, thresholds, labels, LIMIT);
invalid cases state a fragment of the error message. Cases near the end are regressions: compiler bugs
found while writing this corpus, since fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from support.cases import empty_keyword_session

from quail import CompileError, DocumentProvider
from quail.logical.nodes import (
    Classify,
    Join,
    LogicalNode,
    Project,
    Scan,
    Score,
    SemanticFilter,
    SemanticJoin,
    Verdict,
    ai_predicates,
    walk,
)

SF = "snowflake"
BQ = "bigquery"

TABLES: dict[str, dict[str, list[Any]]] = {
    "reviews": {"id": [1, 2, 3], "body": ["great acting", "dull plot", "fine"], "title": ["A", "B", "C"],
                "stars": [5, 1, 3]},
    "aspects": {"id": [1, 2], "aspect": ["acting", "plot"], "description": ["the cast", "the story"]},
    "claims": {"id": [1, 2], "text": ["the sky is blue", "water is dry"], "url": ["u1", "u2"]},
    "evidence": {"id": [1, 2, 3], "passage": ["blue sky", "wet water", "dry land"], "source_id": ["u1", "u2", "u2"]},
    "traces": {"id": [1, 2], "log": ["ok", "error: timeout"]},
}
REVIEW_COLUMNS = ("r.id", "r.body", "r.title", "r.stars")


@pytest.fixture(scope="module")
def session():
    with empty_keyword_session() as s:
        for name, columns in TABLES.items():
            s.register(name, DocumentProvider.from_table(pa.table(columns), "id"))
        yield s


# -- what a plan says, in comparable form ---------------------------------------------------------


def shape(node: LogicalNode) -> str:
    """The tree of node types, e.g. `Project(SemanticJoin(Scan, Scan))`."""
    name = type(node).__name__
    if not node.children:
        return name
    return f"{name}({', '.join(shape(child) for child in node.children)})"


def summary(plan: LogicalNode) -> dict[str, Any]:
    """Facts about a compiled plan that the corpus cases assert on."""
    assert isinstance(plan, Project)
    nodes = walk(plan)
    predicates = ai_predicates(plan)
    classifies = [n for n in nodes if isinstance(n, Classify)]
    return {
        "shape": shape(plan),
        "columns": tuple(str(c.source) if c.source is not None else c.name for c in plan.columns),
        "names": tuple(c.name for c in plan.columns),
        "limit": plan.limit,
        "predicates": len(predicates),
        "selectivities": tuple(p.selectivity for p in predicates),
        "anchors": tuple(p.anchor for p in predicates),
        "thresholds": tuple((p.threshold.op, p.threshold.value) for p in predicates if p.threshold is not None),
        "prompt_columns": tuple(tuple(str(c) for c in p.prompt.columns) for p in predicates),
        "semantics": tuple(n.semantics for n in nodes if isinstance(n, SemanticJoin)),
        "equalities": tuple(str(e) for n in nodes if isinstance(n, Join | SemanticJoin) for e in n.equalities),
        "filter_aliases": tuple(n.alias for n in nodes if isinstance(n, SemanticFilter)),
        "scans": tuple((n.table, n.alias) for n in nodes if isinstance(n, Scan)),
        "labels": {n.output: tuple((label.name, label.description) for label in n.labels) for n in classifies},
        "allowed": {n.output: n.allowed for n in classifies},
        "instructions": {n.output: n.instructions for n in classifies},
        "classify_inputs": {n.output: (n.prompt.template, tuple(str(c) for c in n.prompt.columns))
                            for n in classifies},
        "scores": tuple(n.output for n in nodes if isinstance(n, Score)),
        "verdicts": tuple(n.output for n in nodes if isinstance(n, Verdict)),
        "scan_where": {n.alias: n.where for n in nodes if isinstance(n, Scan) and n.where},
        "tail": plan.statement,
    }


SUMMARY_KEYS = ("shape", "columns", "names", "limit", "predicates", "selectivities", "anchors", "thresholds",
                "prompt_columns", "semantics", "equalities", "filter_aliases", "scans", "labels", "allowed",
                "instructions", "classify_inputs", "scores", "verdicts", "scan_where", "tail")


# -- the corpus -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Valid:
    id: str
    dialect: str
    sql: str
    expect: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Invalid:
    id: str
    dialect: str
    sql: str
    message: str


FILTER_R = "AI_FILTER(PROMPT('Is {0} positive?', r.body))"
JOIN_RA = "AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))"
BQ_JOIN_RA = "AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))"
SUPPORTS = "AI_FILTER(PROMPT('Does {0} support {1}?', e.passage, c.text))"
SCORE_R = "AI.SCORE(PROMPT('How positive is {0}?', r.body))"
ONE_FILTER = "Project(SemanticFilter(Scan))"
TWO_WAY = "Project(SemanticJoin(Scan, Scan))"

VALID: list[Valid] = [
    # AI_FILTER, both spellings, with and without options
    Valid("filter_snowflake_with_selectivity", SF,
          "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.3})",
          {"shape": ONE_FILTER, "columns": ("r.id",), "names": ("id",), "predicates": 1, "selectivities": (0.3,),
           "prompt_columns": (("r.body",),), "filter_aliases": ("r",)}),
    Valid("filter_snowflake_dollar_quoted_template", SF,
          "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT($$Is it 'great'? {0}$$, r.body))",
          {"shape": "Project(SemanticFilter(Scan))", "predicates": 1}),
    Valid("filter_bigquery_ai_if_without_options", BQ,
          "SELECT * FROM reviews r WHERE AI.IF(PROMPT('Is {0} positive?', r.body))",
          {"shape": ONE_FILTER, "columns": REVIEW_COLUMNS, "selectivities": (None,), "anchors": (None,)}),
    Valid("filter_bigquery_struct_selectivity", BQ,
          "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('Is {0} positive?', r.body), STRUCT(0.3 AS selectivity))",
          {"shape": ONE_FILTER, "selectivities": (0.3,)}),
    Valid("filter_snowflake_reads_bigquery_spelling_too", SF,
          "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.25})",
          {"shape": ONE_FILTER, "selectivities": (0.25,)}),
    Valid("filter_selectivity_bounds_zero_and_one", SF,
          "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0} a', r.body), {'selectivity': 0}) "
          "AND AI_FILTER(PROMPT('{0} b', r.body), {'selectivity': 1})",
          {"selectivities": (0.0, 1.0)}),
    Valid("filters_anded_on_one_table_merge_into_one_node", SF,
          f"SELECT r.id FROM reviews r WHERE {FILTER_R} AND AI_FILTER(PROMPT('Is {{0}} long?', r.body), "
          "{'selectivity': 0.5})",
          {"shape": ONE_FILTER, "predicates": 2, "filter_aliases": ("r",), "selectivities": (None, 0.5)}),
    Valid("filters_three_anded_with_parentheses_bigquery", BQ,
          "SELECT r.id FROM reviews r WHERE (AI.IF(PROMPT('a {0}', r.body)) AND AI.IF(PROMPT('b {0}', r.body))) "
          "AND AI.IF(PROMPT('c {0}', r.body))",
          {"shape": ONE_FILTER, "predicates": 3, "filter_aliases": ("r",)}),
    Valid("filter_on_traces_log", SF,
          "SELECT t.id, t.log FROM traces t WHERE AI_FILTER(PROMPT('Does {0} show an error?', t.log))",
          {"shape": ONE_FILTER, "columns": ("t.id", "t.log"), "scans": (("traces", "t"),)}),
    Valid("filter_table_without_alias_uses_table_name", SF,
          "SELECT reviews.id FROM reviews WHERE AI_FILTER(PROMPT('{0}', reviews.body))",
          {"shape": ONE_FILTER, "columns": ("reviews.id",), "scans": (("reviews", "reviews"),)}),
    # joins
    Valid("join_on_ai_filter", SF,
          f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {JOIN_RA}",
          {"shape": TWO_WAY, "semantics": ("full",), "columns": ("r.id", "a.aspect"),
           "prompt_columns": (("r.body", "a.aspect"),), "anchors": (None,)}),
    Valid("join_on_with_anchor_and_selectivity", SF,
          "SELECT r.id FROM reviews r INNER JOIN aspects a "
          "ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'anchor': 'a', 'selectivity': 0.1})",
          {"shape": TWO_WAY, "anchors": ("a",), "selectivities": (0.1,)}),
    Valid("join_bigquery_comma_join_predicate_in_where", BQ,
          f"SELECT r.id, a.id FROM reviews r, aspects a WHERE {BQ_JOIN_RA}",
          {"shape": TWO_WAY, "semantics": ("full",), "columns": ("r.id", "a.id")}),
    Valid("join_snowflake_comma_join_predicate_in_where", SF,
          f"SELECT r.id FROM reviews r, aspects a WHERE {JOIN_RA}",
          {"shape": TWO_WAY, "semantics": ("full",)}),
    Valid("join_cross_join_predicate_in_where", SF,
          f"SELECT r.id FROM reviews r CROSS JOIN aspects a WHERE {JOIN_RA}",
          {"shape": TWO_WAY, "semantics": ("full",), "predicates": 1}),
    Valid("join_bigquery_cross_join_struct_anchor", BQ,
          "SELECT r.id FROM reviews r CROSS JOIN aspects a "
          "WHERE AI.IF(PROMPT('{0} {1}', r.body, a.aspect), STRUCT('a' AS anchor, 0.2 AS selectivity))",
          {"shape": TWO_WAY, "anchors": ("a",), "selectivities": (0.2,)}),
    Valid("join_self_join_two_aliases", SF,
          "SELECT r1.id, r2.id FROM reviews r1 JOIN reviews r2 "
          "ON AI_FILTER(PROMPT('Does {0} contradict {1}?', r1.body, r2.body))",
          {"shape": TWO_WAY, "columns": ("r1.id", "r2.id"), "scans": (("reviews", "r1"), ("reviews", "r2"))}),
    Valid("join_multiway_prompt_three_tables", SF,
          "SELECT r.id, a.id, c.id FROM reviews r, aspects a, claims c "
          "WHERE AI_FILTER(PROMPT('Do {0}, {1} and {2} agree?', r.body, a.aspect, c.text))",
          {"shape": "Project(SemanticJoin(Join(Scan, Scan), Scan))", "predicates": 1,
           "prompt_columns": (("r.body", "a.aspect", "c.text"),), "columns": ("r.id", "a.id", "c.id")}),
    Valid("join_chain_of_two_on_clauses", SF,
          f"SELECT r.id, c.id FROM reviews r JOIN aspects a ON {JOIN_RA} "
          "JOIN claims c ON AI_FILTER(PROMPT('Is {0} relevant to {1}?', a.aspect, c.text))",
          {"shape": "Project(SemanticJoin(SemanticJoin(Scan, Scan), Scan))", "predicates": 2,
           "semantics": ("full", "full")}),
    Valid("join_on_column_equality_restricts_pairs", SF,
          f"SELECT * FROM claims c JOIN evidence e ON c.url = e.source_id AND {SUPPORTS}",
          {"shape": TWO_WAY, "equalities": ("c.url = e.source_id",),
           "columns": ("c.id", "c.text", "c.url", "e.id", "e.passage", "e.source_id")}),
    Valid("join_bigquery_equality_in_where_of_comma_join", BQ,
          "SELECT c.id, e.id FROM claims c, evidence e "
          "WHERE c.url = e.source_id AND AI.IF(PROMPT('Does {0} back {1}?', e.passage, c.text))",
          {"shape": TWO_WAY, "equalities": ("c.url = e.source_id",)}),
    Valid("join_equality_only_with_filter_on_one_side", SF,
          "SELECT c.id FROM claims c JOIN evidence e ON c.url = e.source_id "
          "WHERE AI_FILTER(PROMPT('Is {0} recent?', e.passage))",
          {"shape": "Project(Join(Scan, SemanticFilter(Scan)))", "equalities": ("c.url = e.source_id",),
           "filter_aliases": ("e",)}),
    Valid("join_filter_pushed_below_join", SF,
          f"SELECT r.id FROM reviews r JOIN aspects a ON {JOIN_RA} WHERE {FILTER_R}",
          {"shape": "Project(SemanticJoin(SemanticFilter(Scan), Scan))", "predicates": 2,
           "filter_aliases": ("r",)}),
    # [NOT] EXISTS
    Valid("exists_is_a_semi_join_anchored_on_the_outer_alias", SF,
          f"SELECT c.id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e WHERE {SUPPORTS})",
          {"shape": TWO_WAY, "semantics": ("exists",), "anchors": ("c",), "columns": ("c.id",)}),
    Valid("not_exists_is_an_anti_join_anchored_on_the_outer_alias", SF,
          f"SELECT c.id FROM claims c WHERE NOT EXISTS (SELECT 1 FROM evidence e WHERE {SUPPORTS})",
          {"shape": TWO_WAY, "semantics": ("anti",), "anchors": ("c",)}),
    Valid("not_exists_bigquery_spelling", BQ,
          "SELECT c.id FROM claims c WHERE NOT EXISTS "
          "(SELECT * FROM evidence e WHERE AI.IF(PROMPT('Does {0} refute {1}?', e.passage, c.text)))",
          {"shape": TWO_WAY, "semantics": ("anti",), "anchors": ("c",)}),
    Valid("exists_with_equality_and_inner_filter", SF,
          "SELECT c.id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e WHERE e.source_id = c.url "
          f"AND AI_FILTER(PROMPT('Is {{0}} peer reviewed?', e.passage)) AND {SUPPORTS})",
          {"shape": "Project(SemanticJoin(Scan, SemanticFilter(Scan)))", "semantics": ("exists",),
           "equalities": ("e.source_id = c.url",), "anchors": (None, "c"), "filter_aliases": ("e",)}),
    Valid("exists_with_outer_filter_and_star_keeps_outer_columns", SF,
          "SELECT * FROM claims c WHERE AI_FILTER(PROMPT('Is {0} a claim?', c.text)) "
          f"AND EXISTS (SELECT 1 FROM evidence e WHERE {SUPPORTS})",
          {"shape": "Project(SemanticJoin(SemanticFilter(Scan), Scan))", "semantics": ("exists",),
           "columns": ("c.id", "c.text", "c.url"), "anchors": (None, "c")}),
    # AI.CLASSIFY
    Valid("classify_bigquery_string_list", BQ,
          "SELECT r.id, AI.CLASSIFY(r.body, ['pos', 'neg']) AS sentiment FROM reviews r",
          {"shape": "Project(Classify(Scan))", "columns": ("r.id", "sentiment"),
           "labels": {"sentiment": (("pos", None), ("neg", None))}, "allowed": {"sentiment": None},
           "classify_inputs": {"sentiment": ("{0}", ("r.body",))}}),
    Valid("classify_snowflake_string_list", SF,
          "SELECT r.id, AI_CLASSIFY(r.body, ['pos', 'neg']) AS sentiment FROM reviews r",
          {"shape": "Project(Classify(Scan))", "labels": {"sentiment": (("pos", None), ("neg", None))}}),
    Valid("classify_snowflake_array_constructor", SF,
          "SELECT r.id, AI_CLASSIFY(r.body, ARRAY['pos', 'neg', 'mixed']) AS sentiment FROM reviews r",
          {"labels": {"sentiment": (("pos", None), ("neg", None), ("mixed", None))}}),
    Valid("classify_bigquery_array_constructor", BQ,
          "SELECT r.id, AI.CLASSIFY(r.body, ARRAY['pos', 'neg']) AS sentiment FROM reviews r",
          {"labels": {"sentiment": (("pos", None), ("neg", None))}}),
    Valid("classify_labels_with_descriptions", BQ,
          "SELECT r.id, AI.CLASSIFY(r.body, [('pos', 'praises the film'), ('neg', 'complains')]) AS sentiment "
          "FROM reviews r",
          {"labels": {"sentiment": (("pos", "praises the film"), ("neg", "complains"))}}),
    Valid("classify_where_name_in_keeps_those_labels", SF,
          "SELECT r.id, AI_CLASSIFY(r.body, ['pos', 'neg', 'mixed']) AS sentiment FROM reviews r "
          "WHERE sentiment IN ('pos', 'mixed')",
          {"shape": "Project(Classify(Scan))", "allowed": {"sentiment": ("pos", "mixed")}}),
    Valid("classify_prompt_input_with_task_description", SF,
          "SELECT r.id, AI_CLASSIFY(PROMPT('Topic of {0}', r.body), ['film', 'food'], "
          "{'task_description': 'pick one'}) AS topic FROM reviews r",
          {"classify_inputs": {"topic": ("Topic of {0}", ("r.body",))}, "instructions": {"topic": "pick one"}}),
    # AI.SCORE in SELECT and as a filter, literal on either side
    Valid("score_in_select_bigquery", BQ,
          f"SELECT r.id, {SCORE_R} AS positivity FROM reviews r",
          {"shape": "Project(Score(Scan))", "columns": ("r.id", "positivity"), "scores": ("positivity",),
           "predicates": 0}),
    Valid("score_in_select_snowflake", SF,
          "SELECT r.id, AI_SCORE(PROMPT('How positive is {0}?', r.body)) AS positivity FROM reviews r",
          {"shape": "Project(Score(Scan))", "scores": ("positivity",)}),
    Valid("score_filter_gte", BQ, f"SELECT r.id FROM reviews r WHERE {SCORE_R} >= 0.8",
          {"shape": ONE_FILTER, "thresholds": ((">=", 0.8),)}),
    Valid("score_filter_gt", BQ, f"SELECT r.id FROM reviews r WHERE {SCORE_R} > 0.8",
          {"shape": ONE_FILTER, "thresholds": ((">", 0.8),)}),
    Valid("score_filter_lte", SF, f"SELECT r.id FROM reviews r WHERE {SCORE_R} <= 0.2",
          {"shape": ONE_FILTER, "thresholds": (("<=", 0.2),)}),
    Valid("score_filter_lt", SF, f"SELECT r.id FROM reviews r WHERE {SCORE_R} < 0.2",
          {"shape": ONE_FILTER, "thresholds": (("<", 0.2),)}),
    Valid("score_filter_literal_left_lte_flips_to_gte", BQ, f"SELECT r.id FROM reviews r WHERE 0.8 <= {SCORE_R}",
          {"shape": ONE_FILTER, "thresholds": ((">=", 0.8),)}),
    Valid("score_filter_literal_left_lt_flips_to_gt", BQ, f"SELECT r.id FROM reviews r WHERE 0.8 < {SCORE_R}",
          {"shape": ONE_FILTER, "thresholds": ((">", 0.8),)}),
    Valid("score_filter_literal_left_gte_flips_to_lte", SF, f"SELECT r.id FROM reviews r WHERE 0.2 >= {SCORE_R}",
          {"shape": ONE_FILTER, "thresholds": (("<=", 0.2),)}),
    Valid("score_filter_literal_left_gt_flips_to_lt", SF, f"SELECT r.id FROM reviews r WHERE 0.2 > {SCORE_R}",
          {"shape": ONE_FILTER, "thresholds": (("<", 0.2),)}),
    Valid("score_as_join_condition", BQ,
          "SELECT r.id, a.id FROM reviews r JOIN aspects a "
          "ON AI.SCORE(PROMPT('How much does {0} discuss {1}?', r.body, a.aspect)) >= 0.5",
          {"shape": TWO_WAY, "semantics": ("full",), "thresholds": ((">=", 0.5),)}),
    # SELECT lists and LIMIT
    Valid("select_star_over_a_join_lists_every_column", SF,
          f"SELECT * FROM reviews r JOIN aspects a ON {JOIN_RA}",
          {"columns": (*REVIEW_COLUMNS, "a.id", "a.aspect", "a.description")}),
    Valid("select_alias_star_and_a_column", SF,
          f"SELECT r.*, a.aspect FROM reviews r JOIN aspects a ON {JOIN_RA}",
          {"columns": (*REVIEW_COLUMNS, "a.aspect")}),
    Valid("select_bare_unambiguous_columns", SF,
          "SELECT body, aspect, stars FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('{0} {1}', body, aspect))",
          {"columns": ("r.body", "a.aspect", "r.stars"), "prompt_columns": (("r.body", "a.aspect"),)}),
    Valid("select_limit", SF, f"SELECT r.id FROM reviews r WHERE {FILTER_R} LIMIT 10",
          {"shape": ONE_FILTER, "limit": 10}),
    Valid("select_limit_bigquery", BQ, "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('{0}', r.body)) LIMIT 3",
          {"limit": 3}),
    Valid("select_no_limit_is_none", SF, f"SELECT r.id FROM reviews r WHERE {FILTER_R}", {"limit": None}),
    Valid("all_ai_functions_together", SF,
          "SELECT r.id, AI_CLASSIFY(r.body, ['pos', 'neg']) AS sentiment, "
          "AI_SCORE(PROMPT('Helpful? {0}', r.body)) AS helpful FROM reviews r "
          "WHERE AI_FILTER(PROMPT('Is {0} in English?', r.body)) AND sentiment IN ('pos') LIMIT 0",
          {"shape": "Project(Score(Classify(SemanticFilter(Scan))))", "columns": ("r.id", "sentiment", "helpful"),
           "limit": 0, "allowed": {"sentiment": ("pos",)}, "scores": ("helpful",), "predicates": 1}),
    Valid("multi_line_query_with_comments", SF,
          "-- reviews that praise the acting\nSELECT r.id,\n       r.title\n  FROM reviews r\n"
          " WHERE AI_FILTER(PROMPT('Does {0} praise the acting?', r.body)) -- the filter\n LIMIT 5",
          {"shape": ONE_FILTER, "columns": ("r.id", "r.title"), "limit": 5}),
    # around the AI calls: constructs refused before the relational tail existed. Each runs against an
    # independent DuckDB oracle in test_sql_relational.py (ACCEPTED_ELSEWHERE there).
    Valid("or_between_ai_predicates_becomes_two_boolean_columns", SF,
          f"SELECT r.id FROM reviews r WHERE {FILTER_R} OR AI_FILTER(PROMPT('Is {{0}} long?', r.body))",
          {"shape": "Project(Verdict(Verdict(Scan)))", "predicates": 0, "verdicts": ("ai_if_2", "ai_if_1")}),
    Valid("left_outer_join_on_an_ai_predicate", SF, f"SELECT r.id FROM reviews r LEFT JOIN aspects a ON {JOIN_RA}",
          {"shape": TWO_WAY, "semantics": ("left",), "columns": ("r.id",)}),
    Valid("in_subquery_runs_at_the_scan", SF,
          f"SELECT r.id FROM reviews r WHERE r.id IN (SELECT a.id FROM aspects a) AND {FILTER_R}",
          {"shape": ONE_FILTER, "scan_where": {"r": "r.id IN (SELECT a.id FROM aspects AS a)"}}),
    Valid("subquery_in_from_is_scanned_by_duckdb", SF,
          "SELECT t.id FROM (SELECT * FROM reviews WHERE stars > 1) t WHERE AI_FILTER(PROMPT('{0}', t.body))",
          {"shape": ONE_FILTER, "scans": (("(subquery)", "t"),), "columns": ("t.id",)}),
    Valid("with_clause_cte_is_a_table", SF,
          "WITH good AS (SELECT * FROM reviews WHERE stars >= 3) SELECT g.id FROM good g "
          "WHERE AI_FILTER(PROMPT('{0}', g.body))", {"shape": ONE_FILTER, "scans": (("good", "g"),)}),
    Valid("ai_block_inside_a_cte", BQ,
          "WITH s AS (SELECT r.id, AI.SCORE(PROMPT('{0}?', r.body)) AS sc FROM reviews r) "
          "SELECT id FROM s ORDER BY sc DESC LIMIT 2", {"shape": "Project(Score(Scan))", "scores": ("sc",),
                                                        "limit": None}),
    Valid("window_function_over_the_result", SF,
          f"SELECT r.id, ROW_NUMBER() OVER (ORDER BY r.id) AS n FROM reviews r WHERE {FILTER_R}",
          {"shape": ONE_FILTER, "limit": None}),
    Valid("group_by_with_count", SF, f"SELECT r.stars, COUNT(*) AS n FROM reviews r WHERE {FILTER_R} GROUP BY r.stars",
          {"shape": ONE_FILTER, "columns": ("r.stars",)}),
    Valid("order_by_a_column_then_limit_stops_the_model", SF,
          f"SELECT r.id FROM reviews r WHERE {FILTER_R} ORDER BY r.id LIMIT 2", {"shape": ONE_FILTER, "limit": 2}),
    Valid("order_by_an_expression_then_limit_keeps_every_row_for_the_model", SF,
          f"SELECT r.id FROM reviews r WHERE {FILTER_R} ORDER BY LENGTH(r.body) LIMIT 2",
          {"shape": ONE_FILTER, "limit": None}),
    Valid("distinct", SF, f"SELECT DISTINCT r.stars FROM reviews r WHERE {FILTER_R}", {"shape": ONE_FILTER}),
    Valid("having_over_a_group", SF,
          f"SELECT r.stars FROM reviews r WHERE {FILTER_R} GROUP BY r.stars HAVING COUNT(*) > 1",
          {"shape": ONE_FILTER}),
    Valid("offset_pushes_limit_plus_offset", SF, f"SELECT r.id FROM reviews r WHERE {FILTER_R} LIMIT 5 OFFSET 2",
          {"shape": ONE_FILTER, "limit": 7}),
    Valid("aggregate_in_select", SF, f"SELECT COUNT(*) FROM reviews r WHERE {FILTER_R}", {"shape": ONE_FILTER}),
    Valid("plain_alias_in_select", SF, f"SELECT r.id AS rid FROM reviews r WHERE {FILTER_R}",
          {"shape": ONE_FILTER, "columns": ("r.id",)}),
    Valid("ai_filter_in_select_is_a_boolean_column", SF, f"SELECT r.id, {FILTER_R} AS positive FROM reviews r",
          {"shape": "Project(Verdict(Scan))", "verdicts": ("positive",)}),
    Valid("ai_filter_in_select_and_where_is_computed_once", SF,
          f"SELECT r.id, {FILTER_R} AS positive FROM reviews r WHERE {FILTER_R}",
          {"shape": ONE_FILTER, "verdicts": ()}),
    Valid("not_ai_filter", SF, f"SELECT r.id FROM reviews r WHERE NOT {FILTER_R}",
          {"shape": "Project(Verdict(Scan))", "predicates": 0}),
    Valid("score_compared_to_a_column", BQ, f"SELECT r.id FROM reviews r WHERE {SCORE_R} >= r.stars / 5",
          {"shape": "Project(Score(Scan))", "predicates": 0}),
    Valid("score_compared_to_a_score", BQ,
          f"SELECT r.id FROM reviews r WHERE {SCORE_R} >= AI.SCORE(PROMPT('{{0}}!', r.body))",
          {"shape": "Project(Score(Score(Scan)))"}),
    Valid("score_equality_is_a_relational_condition", SF, f"SELECT r.id FROM reviews r WHERE {SCORE_R} = 0.5",
          {"shape": "Project(Score(Scan))", "thresholds": ()}),
    Valid("score_unnamed_in_select_is_named_by_its_text", BQ, f"SELECT r.id, {SCORE_R} FROM reviews r",
          {"shape": "Project(Score(Scan))", "scores": ("ai_score_1",)}),
    Valid("classify_unnamed_in_select", BQ, "SELECT r.id, AI.CLASSIFY(r.body, ['pos', 'neg']) FROM reviews r",
          {"shape": "Project(Classify(Scan))"}),
    Valid("group_by_a_classification", BQ,
          "SELECT AI.CLASSIFY(r.body, ['pos', 'neg']) AS c, COUNT(*) AS n FROM reviews r GROUP BY c",
          {"shape": "Project(Classify(Scan))", "labels": {"c": (("pos", None), ("neg", None))}}),
    Valid("column_predicate_runs_at_the_scan", SF,
          f"SELECT r.id FROM reviews r WHERE r.stars >= 3 AND r.title IN ('A', 'C') AND {FILTER_R}",
          {"shape": ONE_FILTER, "scan_where": {"r": "(r.stars >= 3) AND (r.title IN ('A', 'C'))"}}),
    Valid("column_predicate_in_an_inner_on_runs_at_the_scan", SF,
          f"SELECT r.id FROM reviews r JOIN aspects a ON a.aspect LIKE 'a%' AND {JOIN_RA}",
          {"shape": TWO_WAY, "scan_where": {"a": "a.aspect LIKE 'a%'"}}),
    Valid("uncorrelated_exists_around_an_ai_block", SF,
          "SELECT c.id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e WHERE EXISTS "
          "(SELECT 1 FROM reviews r WHERE AI_FILTER(PROMPT('{0} {1}', e.passage, r.body))))",
          {"shape": "Project(SemanticJoin(Scan, Scan))", "semantics": ("exists",), "scans": (("evidence", "e"),
                                                                                           ("reviews", "r"))}),
    Valid("star_exclude_around_ai", SF, f"SELECT * EXCLUDE (body) FROM reviews r WHERE {FILTER_R}",
          {"shape": ONE_FILTER, "columns": ("r.id", "r.title", "r.stars")}),
    Valid("bigquery_star_except_around_ai", BQ, "SELECT * EXCEPT (body) FROM reviews r WHERE AI.IF(PROMPT('{0}', "
          "r.body))", {"shape": ONE_FILTER, "columns": ("r.id", "r.title", "r.stars")}),
    Valid("label_in_unnest_is_a_relational_condition", BQ,
          "SELECT r.id, AI.CLASSIFY(r.body, ['pos', 'neg']) AS sentiment FROM reviews r "
          "WHERE sentiment IN UNNEST(['pos'])", {"shape": "Project(Classify(Scan))", "allowed": {"sentiment": None}}),
    Valid("qualify_over_a_window", SF,
          f"SELECT r.id FROM reviews r WHERE {FILTER_R} QUALIFY ROW_NUMBER() OVER (ORDER BY r.id) = 1",
          {"shape": ONE_FILTER}),
]

INVALID: list[Invalid] = [
    # around the AI calls: what stays out of reach, refused by name
    Invalid("having_without_group_by_is_bound_by_duckdb", SF,
            f"SELECT r.stars FROM reviews r WHERE {FILTER_R} HAVING COUNT(*) > 1", "must appear in the GROUP BY"),
    Invalid("unknown_function_is_bound_by_duckdb", SF,
            f"SELECT nosuchfunction(r.id) FROM reviews r WHERE {FILTER_R}", "nosuchfunction"),
    Invalid("type_error_in_an_aggregate", SF, f"SELECT SUM(r.body) FROM reviews r WHERE {FILTER_R}", "sum(VARCHAR)"),
    Invalid("unknown_column_in_group_by", SF,
            f"SELECT COUNT(*) FROM reviews r WHERE {FILTER_R} GROUP BY r.nope", "unknown column r.nope"),
    Invalid("reserved_alias_prefix", SF, "SELECT q.id FROM reviews __quail_x WHERE AI_FILTER(PROMPT('{0}', "
            "__quail_x.body))", "reserved for Quail"),
    # constructs outside the supported surface
    Invalid("not_a_select_statement", SF, "INSERT INTO reviews VALUES (1)", "INSERT is not a query"),
    Invalid("on_clause_refers_to_a_later_table", SF,
            "SELECT r.id FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('{0} {1}', r.body, c.text)) "
            "JOIN claims c ON AI_FILTER(PROMPT('{0} {1}', a.aspect, c.text))", "which is joined later"),
    # names
    Invalid("unknown_table_lists_registered_tables", SF,
            "SELECT n.id FROM nope n WHERE AI_FILTER(PROMPT('{0}', n.body))",
            "unknown table 'nope'; registered tables: aspects, claims, evidence, reviews, traces"),
    Invalid("unknown_alias", SF, f"SELECT x.id FROM reviews r WHERE {FILTER_R}",
            "unknown alias 'x'; aliases in scope: r"),
    Invalid("unknown_qualified_column_lists_columns", SF, f"SELECT r.nope FROM reviews r WHERE {FILTER_R}",
            "unknown column r.nope; columns of reviews (r): id, body, title, stars"),
    Invalid("unknown_bare_column_lists_columns_in_scope", BQ,
            "SELECT nope FROM reviews r WHERE AI.IF(PROMPT('{0}', r.body))",
            "unknown column 'nope'; columns in scope: r.id, r.body, r.title, r.stars"),
    Invalid("ambiguous_bare_column", SF, f"SELECT id FROM reviews r JOIN aspects a ON {JOIN_RA}",
            "ambiguous column 'id': it could be r.id or a.id"),
    Invalid("alias_used_for_two_tables", SF, f"SELECT r.id FROM reviews r JOIN aspects r ON {FILTER_R}",
            "alias 'r' is used for two tables"),
    Invalid("exists_alias_outside_its_subquery", SF,
            f"SELECT e.id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e WHERE {SUPPORTS})",
            "alias 'e' is only visible inside its EXISTS subquery"),
    # PROMPT placeholders and document columns
    Invalid("placeholder_missing", SF, "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is it good?', r.body))",
            "has no placeholder {0}"),
    Invalid("placeholder_extra", SF, "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0} vs {1}', r.body))",
            "placeholder {1} has no column"),
    Invalid("placeholder_repeated", BQ, "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('{0} and {0}', r.body))",
            "placeholder {0} appears more than once"),
    Invalid("prompt_without_column_arguments", SF, "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}'))",
            "PROMPT needs at least one column argument"),
    Invalid("prompt_without_template", SF, "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT(r.body))",
            "PROMPT without a template string"),
    # options
    Invalid("anchor_on_a_single_table_filter", SF,
            "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}', r.body), {'anchor': 'r'})",
            "anchor 'r' is outside its join"),
    Invalid("anchor_not_in_the_join", SF,
            "SELECT r.id FROM reviews r JOIN aspects a "
            "ON AI_FILTER(PROMPT('{0} {1}', r.body, a.aspect), {'anchor': 'c'})",
            "anchor 'c' is outside its join: the predicate joins r, a"),
    Invalid("selectivity_not_a_number", SF,
            "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}', r.body), {'selectivity': 'high'})",
            "selectivity must be a number in [0, 1], got 'high'"),
    Invalid("selectivity_above_one", BQ,
            "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('{0}', r.body), STRUCT(1.5 AS selectivity))",
            "selectivity must be a number in [0, 1], got 1.5"),
    Invalid("selectivity_negative", SF,
            "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}', r.body), {'selectivity': -0.1})",
            "selectivity must be a number in [0, 1], got -0.1"),
    Invalid("unknown_option", SF,
            "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}', r.body), {'temperature': 0.5})",
            "option 'temperature'"),
    # AI functions
    Invalid("unknown_ai_function_bigquery", BQ,
            "SELECT r.id FROM reviews r WHERE AI.SUMMARIZE(PROMPT('{0}', r.body))", "AI.SUMMARIZE"),
    Invalid("unknown_ai_function_snowflake", SF,
            "SELECT r.id, AI.SUMMARIZE(PROMPT('{0}', r.body)) AS s FROM reviews r", "AI.SUMMARIZE"),
    Invalid("score_threshold_outside_unit_interval", BQ, f"SELECT r.id FROM reviews r WHERE {SCORE_R} >= 1.5",
            "AI.SCORE compares against a number in [0, 1]"),
    Invalid("classify_as_a_condition", SF, "SELECT r.id FROM reviews r WHERE AI_CLASSIFY(r.body, ['a', 'b'])",
            "AI_CLASSIFY as a condition"),
    Invalid("classify_one_label", SF, "SELECT r.id, AI_CLASSIFY(r.body, ['a']) AS x FROM reviews r",
            "at least two labels"),
    Invalid("classify_duplicate_labels", SF, "SELECT r.id, AI_CLASSIFY(r.body, ['a', 'a']) AS x FROM reviews r",
            "labels must be distinct"),
    Invalid("classify_over_two_tables", SF,
            "SELECT r.id, AI_CLASSIFY(PROMPT('{0} {1}', r.body, a.aspect), ['a', 'b']) AS x "
            f"FROM reviews r JOIN aspects a ON {JOIN_RA}", "exactly one table"),
    Invalid("in_value_that_is_not_a_label", BQ,
            "SELECT r.id, AI.CLASSIFY(r.body, ['pos', 'neg']) AS sentiment FROM reviews r "
            "WHERE sentiment IN ('maybe')", "'maybe' is not a label of sentiment: pos, neg"),
    Invalid("two_outputs_share_a_name", BQ,
            f"SELECT r.id, {SCORE_R} AS s, AI.SCORE(PROMPT('{{0}}!', r.body)) AS s FROM reviews r",
            "two AI outputs share one name"),
    # EXISTS shape
    # whole-query shape
    Invalid("multiple_statements", SF, f"SELECT r.id FROM reviews r WHERE {FILTER_R}; SELECT 1",
            "expected one SQL statement, got 2"),
    Invalid("empty_text", SF, "  -- nothing here\n", "expected one SQL statement, got 0"),
    Invalid("limit_not_an_integer", SF, f"SELECT r.id FROM reviews r WHERE {FILTER_R} LIMIT 1.5",
            "LIMIT with a non-integer value"),
    Invalid("syntax_error_unclosed_parenthesis", SF,
            "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}', r.body)", "syntax error"),
    Invalid("syntax_error_trailing_tokens", BQ,
            "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('{0}', r.body)) garbage garbage", "syntax error"),
    # regressions: constructs that were once silently ignored instead of refused
    Invalid("asof_join_match_condition", SF,
            f"SELECT r.id FROM reviews r ASOF JOIN aspects a MATCH_CONDITION (r.id >= a.id) ON {JOIN_RA}", "ASOF"),
    Invalid("tablesample", SF, f"SELECT r.id FROM reviews r TABLESAMPLE (10) WHERE {FILTER_R}", "TABLESAMPLE"),
    Invalid("pivot", SF,
            f"SELECT r.id FROM reviews r PIVOT (SUM(stars) FOR title IN ('A')) WHERE {FILTER_R}", "PIVOT"),
    Invalid("connect_by", SF, f"SELECT r.id FROM reviews r WHERE {FILTER_R} CONNECT BY PRIOR r.id = r.stars",
            "CONNECT BY"),
    Invalid("select_into", SF, f"SELECT r.id INTO other FROM reviews r WHERE {FILTER_R}", "INTO"),
    Invalid("exists_alias_in_an_outer_equality", SF,
            "SELECT c.id FROM claims c WHERE c.url = e.source_id "
            f"AND EXISTS (SELECT 1 FROM evidence e WHERE {SUPPORTS})",
            "alias 'e' is only visible inside its EXISTS subquery"),
]


def _valid_params() -> list[Any]:
    return [pytest.param(case, id=case.id) for case in VALID]


def _invalid_params() -> list[Any]:
    return [pytest.param(case, id=case.id) for case in INVALID]


# -- the tests ------------------------------------------------------------------------------------


def test_corpus_is_large_unique_and_covers_both_dialects():
    assert len(VALID) >= 35
    assert len(INVALID) >= 35
    ids = [case.id for case in [*VALID, *INVALID]]
    assert len(ids) == len(set(ids))
    assert {case.dialect for case in VALID} == {SF, BQ}
    assert {case.dialect for case in INVALID} == {SF, BQ}
    assert all(case.expect for case in VALID), "every valid case asserts something about its plan"
    known = set(SUMMARY_KEYS)
    for case in VALID:
        assert set(case.expect) <= known, f"{case.id}: unknown expectation keys {set(case.expect) - known}"


@pytest.mark.parametrize("case", _valid_params())
def test_valid_statement_compiles_to_the_expected_plan(session, case: Valid):
    query = session.sql(case.sql, dialect=case.dialect)
    facts = summary(query.logical_plan)
    assert set(facts) == set(SUMMARY_KEYS)
    for key, expected in case.expect.items():
        assert facts[key] == expected, f"{case.id}: {key}"
    assert query.explain().startswith("== Logical plan")


@pytest.mark.parametrize("case", _invalid_params())
def test_invalid_statement_raises_compile_error_naming_the_construct(session, case: Invalid):
    with pytest.raises(CompileError) as info:
        session.sql(case.sql, dialect=case.dialect)
    assert case.message in str(info.value)


@pytest.mark.parametrize(
    ("snowflake", "bigquery"),
    [
        pytest.param("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0} ok?', r.body), {'selectivity': 0.3})",
                     "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('{0} ok?', r.body), STRUCT(0.3 AS selectivity))",
                     id="filter"),
        pytest.param(f"SELECT r.id, a.id FROM reviews r JOIN aspects a ON {JOIN_RA}",
                     f"SELECT r.id, a.id FROM reviews r, aspects a WHERE {BQ_JOIN_RA}", id="join"),
        pytest.param("SELECT r.id, AI_CLASSIFY(r.body, ['pos', 'neg']) AS s FROM reviews r WHERE s IN ('neg')",
                     "SELECT r.id, AI.CLASSIFY(r.body, ['pos', 'neg']) AS s FROM reviews r WHERE s IN ('neg')",
                     id="classify"),
        pytest.param("SELECT r.id, AI_SCORE(PROMPT('{0}', r.body)) AS s FROM reviews r",
                     "SELECT r.id, AI.SCORE(PROMPT('{0}', r.body)) AS s FROM reviews r", id="score"),
        pytest.param(f"SELECT c.id FROM claims c WHERE NOT EXISTS (SELECT 1 FROM evidence e WHERE {SUPPORTS})",
                     "SELECT c.id FROM claims c WHERE NOT EXISTS (SELECT 1 FROM evidence e "
                     "WHERE AI.IF(PROMPT('Does {0} support {1}?', e.passage, c.text)))", id="anti_join"),
    ],
)
def test_both_dialects_compile_to_the_same_plan(session, snowflake: str, bigquery: str):
    assert session.sql(snowflake, dialect=SF).logical_plan == session.sql(bigquery, dialect=BQ).logical_plan


@pytest.mark.parametrize(
    ("flipped", "canonical"),
    [("0.8 <= {s}", "{s} >= 0.8"), ("0.8 < {s}", "{s} > 0.8"), ("0.2 >= {s}", "{s} <= 0.2"),
     ("0.2 > {s}", "{s} < 0.2")],
)
def test_score_literal_on_the_left_normalises_to_the_same_plan(session, flipped: str, canonical: str):
    def plan(condition: str) -> LogicalNode:
        return session.sql(f"SELECT r.id FROM reviews r WHERE {condition.format(s=SCORE_R)}",
                           dialect=BQ).logical_plan

    assert plan(flipped) == plan(canonical)


@pytest.mark.parametrize(
    ("sql", "line", "fragment"),
    [
        pytest.param("SELECT r.id\nFROM reviews r\nWHERE AI_FILTER(PROMPT('{0}', r.nope))", 3, "unknown column r.nope",
                     id="unknown_column_on_line_3"),
        pytest.param("SELECT r.id\nFROM nope r\nWHERE AI_FILTER(PROMPT('{0}', r.body))", 2, "unknown table 'nope'",
                     id="unknown_table_on_line_2"),
        pytest.param("SELECT r.id\nFROM reviews r\nWHERE AI_FILTER(PROMPT('{0}', r.body)\nLIMIT 5", 4,
                     "syntax error", id="syntax_error_on_line_4"),
        pytest.param("SELECT r.id\nFROM reviews r\nWHERE AI_FILTER(PROMPT('{0}', r.body))\nORDER BY r.nope", 4,
                     "unknown column r.nope", id="order_by_unknown_column_on_line_4"),
        pytest.param("SELECT r.id\nFROM reviews r\nWHERE AI_FILTER(PROMPT('{0}', r.body))\nORDER BY SUM(r.body)", 4,
                     "sum(VARCHAR)", id="duckdb_type_error_on_line_4"),
        pytest.param("SELECT r.id\n  FROM reviews r\n  JOIN aspects a\n    ON AI_FILTER(PROMPT('{0} {1}', "
                     "r.body, a.aspect), {'colour': 1})", (3, 4), "option 'colour'", id="join_option_on_line_4"),
        pytest.param("SELECT r.id\nFROM reviews r\nWHERE AI_FILTER(PROMPT('no placeholder', r.body))", 3,
                     "has no placeholder", id="placeholder_on_line_3"),
        pytest.param("SELECT r.id,\n  AI_CLASSIFY(r.body, ['a'])\n    AS x\nFROM reviews r", 2,
                     "at least two labels", id="classify_on_line_2"),
    ],
)
def test_errors_in_multi_line_queries_carry_line_and_column(session, sql: str, line: int | tuple[int, ...],
                                                            fragment: str):
    """`line` is the line of the offending construct (a tuple when the construct spans lines)."""
    with pytest.raises(CompileError) as info:
        session.sql(sql)
    error = info.value
    assert fragment in str(error)
    assert error.line in (line if isinstance(line, tuple) else (line,))
    assert error.column is not None
    assert 1 <= error.column <= len(sql.splitlines()[error.line - 1]) + 1
    assert f"(line {error.line}, column {error.column})" in str(error)


@pytest.mark.parametrize("case", [c for c in INVALID if c.id.startswith("syntax_error")], ids=lambda c: c.id)
def test_syntax_errors_carry_line_and_column(session, case: Invalid):
    with pytest.raises(CompileError) as info:
        session.sql(case.sql, dialect=case.dialect)
    assert info.value.line == 1
    assert info.value.column is not None and info.value.column > 0


def test_unknown_dialect_is_a_compile_error(session):
    with pytest.raises(CompileError, match="unknown SQL dialect 'postgres'"):
        session.sql(f"SELECT r.id FROM reviews r WHERE {FILTER_R}", dialect="postgres")  # type: ignore[arg-type]
