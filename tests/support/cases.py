"""The end-to-end corpus: queries (SQL and builder) on the keyword test backend, each with its oracle, and
the helpers that run and compare them — shared by every test module that runs the corpus elsewhere (another
provider, backend or transport)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from support.e2e_data import (
    TABLES,
    Classify,
    OracleQuery,
    Pred,
    ScoreOut,
    Sub,
    arrow_table,
    evaluate,
    normalized,
    rows_of,
)

import quail
from quail import col, prompt, score
from quail.testing import BASE_MODEL, ByteTokenizer, KeywordBackend

# -- prompts shared by the SQL, the builder and the oracle ------------------------------------------

ACTING = 'Does the review praise the "acting"? {0}'  # keyword rule: "acting" in the review
PLOT = 'Is {0} about the "plot"?'  # keyword rule
MUSIC = 'Does {0} mention "music"?'  # keyword rule
RECOMMEND = "Would a critic recommend this film? {0}"  # hash rule
WORTH = "Is {0} worth watching on a weekend?"  # hash rule
POSITIVE = "How positive is {0}?"  # hash rule, for AI.SCORE
NOTICED = "Is {0} something audiences notice?"  # hash rule over aspects
DISCUSS = "Does the review {0} discuss {1}?"  # shared-word rule over two documents
COVER = "How well does {0} cover {1}?"  # shared-word rule, compared as a score
THREE = "Does {0} discuss {1} the way a {2} film would?"  # shared-word rule over three documents
SUPPORT = "Does {0} support the claim {1}?"  # shared-word rule
PEER = 'Does {0} cite a "peer reviewed" study?'  # keyword rule, both words
CHECKABLE = "Can {0} be checked by a journalist?"  # hash rule over claims
TOPICS = ("acting", "plot", "music")


def sql_prompt(template: str, *refs: str) -> str:
    return f"PROMPT('{template}', {', '.join(refs)})"


def P(template: str, *refs: str, threshold: tuple[str, float] | None = None) -> Pred:
    return Pred(template, refs, threshold)


# -- the session every corpus query runs on ----------------------------------------------------------


KEPT_ENGINES = 8
"""Tests compare backends side by side on one device: keep their engines instead of one per device."""


def empty_keyword_session(registry: quail.ExtensionRegistry | None = None,
                          backend: str = "keyword", **settings: Any) -> quail.Session:
    """A session on the keyword test backend with no table: what compiling and planning need, and no model;
    `settings` are further EngineConfig fields (cache="off", chunk_tokens=…)."""
    tokenizer = ByteTokenizer()
    if registry is None:
        registry = quail.ExtensionRegistry.with_built_ins()
        registry.register_backend(KeywordBackend(tokenizer))
    config = quail.EngineConfig(model=BASE_MODEL, backend=backend, engines_per_device=KEPT_ENGINES, **settings)
    return quail.Session(config, registry=registry, tokenizer=tokenizer)


def keyword_session(registry: quail.ExtensionRegistry | None = None, backend: str = "keyword") -> quail.Session:
    session = empty_keyword_session(registry, backend)
    for name, (_, id_column) in TABLES.items():
        session.register(name, quail.DocumentProvider.from_table(arrow_table(name), id_column))
    return session


# -- the corpus ----------------------------------------------------------------------------------------

SF, BQ = "snowflake", "bigquery"
REVIEW_IDS = [r["id"] for r in rows_of("reviews")]


@dataclass(frozen=True)
class Case:
    id: str
    oracle: OracleQuery
    sql: str | None = None
    dialect: str = SF
    order: str | None = None
    build: Callable[[quail.Session], quail.Query] | None = None
    may_be_empty: bool = False

    def query(self, session: quail.Session) -> quail.Query:
        if self.build is not None:
            return self.build(session)
        assert self.sql is not None
        return session.sql(self.sql, dialect=self.dialect, order=self.order)


RA = (("r", "reviews"), ("a", "aspects"))
JOIN_RA = sql_prompt(DISCUSS, "r.body", "a.aspect")
CE = (("c", "claims"), ("e", "evidence"))
R = (("r", "reviews"),)
C = (("c", "claims"),)

CASES: list[Case] = [
    # -- filters on one table
    Case("one_keyword_filter", OracleQuery(R, ("r.id", "r.title"), (P(ACTING, "r.body"),)),
         f"SELECT r.id, r.title FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})"),
    Case("one_hash_filter_with_selectivity", OracleQuery(R, ("r.id",), (P(RECOMMEND, "r.body"),)),
         f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(RECOMMEND, 'r.body')}, {{'selectivity': 0.4}})"),
    Case("two_filters", OracleQuery(R, ("r.id", "r.stars"), (P(ACTING, "r.body"), P(RECOMMEND, "r.body"))),
         f"SELECT r.id, r.stars FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) "
         f"AND AI_FILTER({sql_prompt(RECOMMEND, 'r.body')}, {{'selectivity': 0.5}})"),
    Case("three_filters", OracleQuery(R, ("r.id",), (P(RECOMMEND, "r.body"), P(PLOT, "r.body"),
                                                     P(WORTH, "r.body"))),
         f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(RECOMMEND, 'r.body')}) "
         f"AND AI_FILTER({sql_prompt(PLOT, 'r.body')}, {{'selectivity': 0.3}}) "
         f"AND AI_FILTER({sql_prompt(WORTH, 'r.body')})"),
    Case("three_filters_as_written", OracleQuery(R, ("r.id", "r.title"), (P(WORTH, "r.body"), P(MUSIC, "r.body"),
                                                                         P(RECOMMEND, "r.body"))),
         f"SELECT r.id, r.title FROM reviews r WHERE AI_FILTER({sql_prompt(WORTH, 'r.body')}) "
         f"AND AI_FILTER({sql_prompt(MUSIC, 'r.body')}, {{'selectivity': 0.1}}) "
         f"AND AI_FILTER({sql_prompt(RECOMMEND, 'r.body')})", order="as_written"),
    Case("bigquery_two_filters", OracleQuery(R, ("r.id",), (P(PLOT, "r.body"), P(WORTH, "r.body"))),
         f"SELECT r.id FROM reviews AS r WHERE AI.IF({sql_prompt(PLOT, 'r.body')}) "
         f"AND AI.IF({sql_prompt(WORTH, 'r.body')})", dialect=BQ),
    # -- AI.SCORE thresholds as filters
    Case("score_at_least", OracleQuery(R, ("r.id",), (P(POSITIVE, "r.body", threshold=(">=", 0.6)),)),
         f"SELECT r.id FROM reviews r WHERE AI_SCORE({sql_prompt(POSITIVE, 'r.body')}) >= 0.6"),
    Case("score_below_and_filter", OracleQuery(R, ("r.id",), (P(POSITIVE, "r.body", threshold=("<", 0.5)),
                                                              P(ACTING, "r.body"))),
         f"SELECT r.id FROM reviews r WHERE AI_SCORE({sql_prompt(POSITIVE, 'r.body')}) < 0.5 "
         f"AND AI_FILTER({sql_prompt(ACTING, 'r.body')})"),
    Case("score_literal_on_the_left", OracleQuery(R, ("r.id",), (P(POSITIVE, "r.body", threshold=(">=", 0.5)),)),
         f"SELECT r.id FROM reviews r WHERE 0.5 <= AI_SCORE({sql_prompt(POSITIVE, 'r.body')})"),
    Case("score_literal_on_the_left_strict", OracleQuery(R, ("r.id",), (P(WORTH, "r.body", threshold=("<", 0.35)),)),
         f"SELECT r.id FROM reviews r WHERE 0.35 > AI_SCORE({sql_prompt(WORTH, 'r.body')})"),
    Case("bigquery_score_threshold_and_if",
         OracleQuery(R, ("r.id",), (P(POSITIVE, "r.body", threshold=(">", 0.55)), P(PLOT, "r.body"))),
         f"SELECT r.id FROM reviews r WHERE AI.SCORE({sql_prompt(POSITIVE, 'r.body')}) > 0.55 "
         f"AND AI.IF({sql_prompt(PLOT, 'r.body')})", dialect=BQ),
    # -- semantic joins
    Case("join_full", OracleQuery(RA, ("r.id", "a.aspect"), (P(DISCUSS, "r.body", "a.aspect"),)),
         f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI_FILTER({JOIN_RA})"),
    Case("join_anchored_on_aspects", OracleQuery(RA, ("r.id", "a.aspect_id"), (P(DISCUSS, "r.body", "a.aspect"),)),
         f"SELECT r.id, a.aspect_id FROM reviews r JOIN aspects a "
         f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}, {{'anchor': 'a'}})"),
    Case("join_anchored_on_reviews", OracleQuery(RA, ("a.aspect", "r.id"), (P(DISCUSS, "r.body", "a.aspect"),)),
         f"SELECT a.aspect, r.id FROM reviews r JOIN aspects a "
         f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}, {{'anchor': 'r', 'selectivity': 0.3}})"),
    Case("join_with_filters_on_both_sides",
         OracleQuery(RA, ("r.id", "a.aspect"), (P(DISCUSS, "r.body", "a.aspect"), P(RECOMMEND, "r.body"),
                                                P(NOTICED, "a.aspect"))),
         f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI_FILTER({JOIN_RA}) "
         f"WHERE AI_FILTER({sql_prompt(RECOMMEND, 'r.body')}) AND AI_FILTER({sql_prompt(NOTICED, 'a.aspect')})"),
    Case("comma_join_bigquery", OracleQuery(RA, ("r.id", "a.aspect"), (P(DISCUSS, "r.body", "a.aspect"),)),
         f"SELECT r.id, a.aspect FROM reviews r, aspects a WHERE AI.IF({sql_prompt(DISCUSS, 'r.body', 'a.aspect')})",
         dialect=BQ),
    Case("comma_join_with_filter_snowflake",
         OracleQuery(RA, ("r.title", "a.aspect"), (P(DISCUSS, "r.body", "a.aspect"), P(ACTING, "r.body"))),
         f"SELECT r.title, a.aspect FROM reviews r, aspects a WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) "
         f"AND AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')})"),
    Case("cross_join", OracleQuery(RA, ("r.id", "a.aspect"), (P(DISCUSS, "r.body", "a.aspect"),)),
         f"SELECT r.id, a.aspect FROM reviews r CROSS JOIN aspects a "
         f"WHERE AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')})"),
    Case("join_on_score_threshold",
         OracleQuery(RA, ("r.id", "a.aspect"), (P(COVER, "r.body", "a.aspect", threshold=(">=", 0.7)),)),
         f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
         f"ON AI_SCORE({sql_prompt(COVER, 'r.body', 'a.aspect')}) >= 0.7"),
    Case("self_join_with_filter",
         OracleQuery((("x", "reviews"), ("y", "reviews")), ("x.id", "y.id"),
                     (P(MUSIC, "x.body"), P(DISCUSS, "x.body", "y.body"))),
         f"SELECT x.id, y.id FROM reviews x JOIN reviews y ON AI_FILTER({sql_prompt(DISCUSS, 'x.body', 'y.body')}) "
         f"WHERE AI_FILTER({sql_prompt(MUSIC, 'x.body')})"),
    # -- equality-restricted joins
    Case("equality_restricted_join",
         OracleQuery(CE, ("c.claim_id", "e.evidence_id"), (P(SUPPORT, "e.passage", "c.text"),),
                     equalities=(("c.url", "e.source"),)),
         f"SELECT c.claim_id, e.evidence_id FROM claims c JOIN evidence e "
         f"ON c.url = e.source AND AI_FILTER({sql_prompt(SUPPORT, 'e.passage', 'c.text')})"),
    Case("equality_restricted_join_reversed_with_filters",
         OracleQuery(CE, ("c.text", "e.passage"), (P(SUPPORT, "c.text", "e.passage"), P(CHECKABLE, "c.text"),
                                                   P(NOTICED, "e.passage")),
                     equalities=(("e.source", "c.url"),)),
         f"SELECT c.text, e.passage FROM claims c JOIN evidence e "
         f"ON AI_FILTER({sql_prompt(SUPPORT, 'c.text', 'e.passage')}) AND e.source = c.url "
         f"WHERE AI_FILTER({sql_prompt(CHECKABLE, 'c.text')}) AND AI_FILTER({sql_prompt(NOTICED, 'e.passage')})"),
    Case("equality_in_where_of_comma_join_bigquery",
         OracleQuery(CE, ("c.claim_id", "e.source"), (P(SUPPORT, "e.passage", "c.text"),),
                     equalities=(("c.url", "e.source"),)),
         f"SELECT c.claim_id, e.source FROM claims c, evidence e WHERE c.url = e.source "
         f"AND AI.IF({sql_prompt(SUPPORT, 'e.passage', 'c.text')})", dialect=BQ),
    # -- more than two tables
    Case("three_way_prompt",
         OracleQuery((*RA, ("g", "genres")), ("r.id", "a.aspect", "g.name"),
                     (P(THREE, "r.body", "a.aspect", "g.description"),)),
         f"SELECT r.id, a.aspect, g.name FROM reviews r CROSS JOIN aspects a CROSS JOIN genres g "
         f"WHERE AI_FILTER({sql_prompt(THREE, 'r.body', 'a.aspect', 'g.description')})"),
    Case("two_joins_sharing_reviews",
         OracleQuery((*RA, ("g", "genres")), ("r.id", "a.aspect", "g.name"),
                     (P(DISCUSS, "r.body", "a.aspect"), P(DISCUSS, "r.body", "g.description"),
                      P(PLOT, "r.body"))),
         f"SELECT r.id, a.aspect, g.name FROM reviews r "
         f"JOIN aspects a ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}) "
         f"JOIN genres g ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'g.description')}) "
         f"WHERE AI_FILTER({sql_prompt(PLOT, 'r.body')})"),
    # -- EXISTS / NOT EXISTS
    Case("exists", OracleQuery(R, ("r.id",), subqueries=(Sub("a", "aspects", P(DISCUSS, "r.body", "a.aspect")),)),
         f"SELECT r.id FROM reviews r WHERE EXISTS (SELECT 1 FROM aspects a "
         f"WHERE AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}))"),
    Case("exists_with_filters_inside_and_outside",
         OracleQuery(R, ("r.id", "r.title"), (P(RECOMMEND, "r.body"),),
                     subqueries=(Sub("a", "aspects", P(DISCUSS, "r.body", "a.aspect"), (P(NOTICED, "a.aspect"),)),)),
         f"SELECT r.id, r.title FROM reviews r WHERE AI_FILTER({sql_prompt(RECOMMEND, 'r.body')}) AND EXISTS "
         f"(SELECT 1 FROM aspects a WHERE AI_FILTER({sql_prompt(NOTICED, 'a.aspect')}) "
         f"AND AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}))"),
    Case("not_exists_with_filters_inside_and_outside",
         OracleQuery(R, ("r.id",), (P(WORTH, "r.body"),),
                     subqueries=(Sub("a", "aspects", P(DISCUSS, "r.body", "a.aspect"), (P(NOTICED, "a.aspect"),),
                                     anti=True),)),
         f"SELECT r.id FROM reviews r WHERE NOT EXISTS (SELECT 1 FROM aspects a "
         f"WHERE AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}) "
         f"AND AI_FILTER({sql_prompt(NOTICED, 'a.aspect')})) AND AI_FILTER({sql_prompt(WORTH, 'r.body')})"),
    Case("not_exists_bigquery",
         OracleQuery(R, ("r.id",), subqueries=(Sub("a", "aspects", P(DISCUSS, "r.body", "a.aspect"), anti=True),)),
         f"SELECT r.id FROM reviews r WHERE NOT EXISTS (SELECT 1 FROM aspects a "
         f"WHERE AI.IF({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}))", dialect=BQ),
    Case("exists_with_equality_and_inner_filter",
         OracleQuery(C, ("c.claim_id",), subqueries=(Sub("e", "evidence", P(SUPPORT, "e.passage", "c.text"),
                                                         (P(PEER, "e.passage"),), (("e.source", "c.url"),)),)),
         f"SELECT c.claim_id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e WHERE e.source = c.url "
         f"AND AI_FILTER({sql_prompt(PEER, 'e.passage')}) "
         f"AND AI_FILTER({sql_prompt(SUPPORT, 'e.passage', 'c.text')}))"),
    Case("not_exists_with_equality",
         OracleQuery(C, ("c.claim_id", "c.text"),
                     subqueries=(Sub("e", "evidence", P(SUPPORT, "e.passage", "c.text"), (),
                                     (("e.source", "c.url"),), anti=True),)),
         f"SELECT c.claim_id, c.text FROM claims c WHERE NOT EXISTS (SELECT 1 FROM evidence e "
         f"WHERE e.source = c.url AND AI_FILTER({sql_prompt(SUPPORT, 'e.passage', 'c.text')}))"),
    # -- classification
    Case("classify", OracleQuery(R, ("r.id", "topic"), classifies=(Classify("r.body", TOPICS, "topic"),)),
         "SELECT r.id, AI_CLASSIFY(r.body, ['acting', 'plot', 'music']) AS topic FROM reviews r"),
    Case("classify_described_labels_in_bigquery",
         OracleQuery(R, ("r.id", "topic"), classifies=(Classify("r.body", TOPICS, "topic", ("plot", "music")),)),
         "SELECT r.id, AI.CLASSIFY(r.body, [('acting', 'the cast and their performances'), "
         "('plot', 'the story and its twists'), ('music', 'the score and soundtrack')]) AS topic "
         "FROM reviews r WHERE topic IN ('plot', 'music')", dialect=BQ),
    Case("classify_in_with_filter",
         OracleQuery(R, ("r.title", "mood"), (P(RECOMMEND, "r.body"),),
                     classifies=(Classify("r.body", ("dull boring weak", "superb brilliant great"), "mood",
                                          ("superb brilliant great",)),)),
         f"SELECT r.title, AI_CLASSIFY(r.body, ['dull boring weak', 'superb brilliant great']) AS mood "
         f"FROM reviews r WHERE mood IN ('superb brilliant great') AND AI_FILTER({sql_prompt(RECOMMEND, 'r.body')})"),
    Case("classify_prompt_input_after_join",
         OracleQuery(RA, ("r.id", "a.aspect", "topic"), (P(DISCUSS, "r.body", "a.aspect"),),
                     classifies=(Classify("r.body", TOPICS, "topic"),)),
         f"SELECT r.id, a.aspect, AI.CLASSIFY({sql_prompt('What is {0} mostly about?', 'r.body')}, "
         f"['acting', 'plot', 'music']) AS topic FROM reviews r JOIN aspects a "
         f"ON AI.IF({sql_prompt(DISCUSS, 'r.body', 'a.aspect')})", dialect=BQ),
    # -- AI.SCORE as an output column
    Case("score_output", OracleQuery(R, ("r.id", "positivity"), (P(PLOT, "r.body"),),
                                     scores=(ScoreOut(P(POSITIVE, "r.body"), "positivity"),)),
         f"SELECT r.id, AI_SCORE({sql_prompt(POSITIVE, 'r.body')}) AS positivity FROM reviews r "
         f"WHERE AI_FILTER({sql_prompt(PLOT, 'r.body')})"),
    Case("score_output_over_join_and_classify",
         OracleQuery(RA, ("topic", "r.id", "a.aspect", "salience"), (P(DISCUSS, "r.body", "a.aspect"),),
                     classifies=(Classify("r.body", TOPICS, "topic"),),
                     scores=(ScoreOut(P(NOTICED, "a.aspect"), "salience"),)),
         f"SELECT AI.CLASSIFY(r.body, ['acting', 'plot', 'music']) AS topic, r.id, a.aspect, "
         f"AI.SCORE({sql_prompt(NOTICED, 'a.aspect')}) AS salience FROM reviews r, aspects a "
         f"WHERE AI.IF({sql_prompt(DISCUSS, 'r.body', 'a.aspect')})", dialect=BQ),
    # -- projections
    Case("select_star", OracleQuery(R, ("*",), (P(ACTING, "r.body"),)),
         f"SELECT * FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})"),
    Case("select_star_over_join", OracleQuery(RA, ("*",), (P(DISCUSS, "r.body", "a.aspect"), P(MUSIC, "r.body"))),
         f"SELECT * FROM reviews r JOIN aspects a ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}) "
         f"WHERE AI_FILTER({sql_prompt(MUSIC, 'r.body')})"),
    Case("alias_star", OracleQuery(RA, ("a.*", "r.title"), (P(DISCUSS, "r.body", "a.aspect"),)),
         f"SELECT a.*, r.title FROM reviews r JOIN aspects a ON AI_FILTER({JOIN_RA})"),
    Case("alias_star_equality_join",
         OracleQuery(CE, ("c.*", "e.evidence_id"), (P(SUPPORT, "e.passage", "c.text"),),
                     equalities=(("c.url", "e.source"),)),
         f"SELECT c.*, e.evidence_id FROM claims c JOIN evidence e "
         f"ON c.url = e.source AND AI_FILTER({sql_prompt(SUPPORT, 'e.passage', 'c.text')})"),
    # -- LIMIT
    Case("limit_filter", OracleQuery(R, ("r.id", "r.title"), (P(RECOMMEND, "r.body"),), limit=3),
         f"SELECT r.id, r.title FROM reviews r WHERE AI_FILTER({sql_prompt(RECOMMEND, 'r.body')}) LIMIT 3"),
    Case("limit_zero", OracleQuery(R, ("r.id",), (P(ACTING, "r.body"),), limit=0),
         f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) LIMIT 0"),
    Case("limit_join", OracleQuery(RA, ("r.id", "a.aspect"), (P(DISCUSS, "r.body", "a.aspect"),), limit=4),
         f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
         f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}) LIMIT 4"),
    Case("limit_larger_than_result", OracleQuery(R, ("r.id",), (P(MUSIC, "r.body"),), limit=100),
         f"SELECT r.id FROM reviews r WHERE AI.IF({sql_prompt(MUSIC, 'r.body')}) LIMIT 100", dialect=BQ),
    Case("limit_classify_in",
         OracleQuery(R, ("r.id", "topic"), classifies=(Classify("r.body", TOPICS, "topic", ("acting",)),), limit=2),
         "SELECT r.id, AI_CLASSIFY(r.body, ['acting', 'plot', 'music']) AS topic FROM reviews r "
         "WHERE topic IN ('acting') LIMIT 2"),
]


# -- the same queries through the Python builder ------------------------------------------------------


def build_two_filters(s: quail.Session) -> quail.Query:
    return (s.docs("reviews").alias("r").ai_filter(prompt(ACTING, col("r.body")))
            .ai_filter(prompt(RECOMMEND, col("r.body")), selectivity=0.5).select("r.id", "r.stars"))


def build_join_with_filters(s: quail.Session) -> quail.Query:
    aspects = s.docs("aspects").alias("a").ai_filter(prompt(NOTICED, col("a.aspect")))
    return (s.docs("reviews").alias("r").ai_filter(prompt(RECOMMEND, col("r.body")))
            .ai_join(aspects, prompt(DISCUSS, col("r.body"), col("a.aspect")), anchor="r")
            .select("r.id", "a.aspect"))


def build_not_exists(s: quail.Session) -> quail.Query:
    aspects = s.docs("aspects").alias("a").ai_filter(prompt(NOTICED, col("a.aspect")))
    return (s.docs("reviews").alias("r")
            .ai_join(aspects, prompt(DISCUSS, col("r.body"), col("a.aspect")), semantics="anti")
            .ai_filter(prompt(WORTH, col("r.body"))).select("r.id"))


def build_classify_in(s: quail.Session) -> quail.Query:
    return (s.docs("reviews").alias("r")
            .ai_classify(col("r.body"), [("acting", "the cast and their performances"),
                                         ("plot", "the story and its twists"), ("music", "the score and soundtrack")],
                         "topic")
            .label_in("topic", "plot", "music").select("r.id", "topic"))


def build_equality_join_score(s: quail.Session) -> quail.Query:
    return (s.docs("claims").alias("c").join(s.docs("evidence").alias("e"), on=col("c.url") == col("e.source"))
            .ai_filter(score(prompt(SUPPORT, col("e.passage"), col("c.text"))) >= 0.6)
            .select("c.claim_id", "e.evidence_id"))


def build_score_output_limit(s: quail.Session) -> quail.Query:
    return (s.docs("reviews").alias("r").ai_filter(prompt(PLOT, col("r.body")))
            .ai_score(prompt(POSITIVE, col("r.body")), "positivity").limit(2).select("r.id", "positivity"))


def _oracle_of(case_id: str) -> OracleQuery:
    return next(c.oracle for c in CASES if c.id == case_id)


CASES += [
    Case("builder_two_filters", _oracle_of("two_filters"), build=build_two_filters),
    Case("builder_join_with_filters_on_both_sides", _oracle_of("join_with_filters_on_both_sides"),
         build=build_join_with_filters),
    Case("builder_not_exists_with_filters", _oracle_of("not_exists_with_filters_inside_and_outside"),
         build=build_not_exists),
    Case("builder_classify_described_labels_in", _oracle_of("classify_described_labels_in_bigquery"),
         build=build_classify_in),
    Case("builder_equality_join_on_score",
         OracleQuery(CE, ("c.claim_id", "e.evidence_id"), (P(SUPPORT, "e.passage", "c.text", threshold=(">=", 0.6)),),
                     equalities=(("c.url", "e.source"),)), build=build_equality_join_score),
    Case("builder_score_output_limit",
         OracleQuery(R, ("r.id", "positivity"), (P(PLOT, "r.body"),),
                     scores=(ScoreOut(P(POSITIVE, "r.body"), "positivity"),), limit=2),
         build=build_score_output_limit),
]
CASE_BY_ID = {case.id: case for case in CASES}


def _params(cases: Sequence[Case]) -> list[Any]:
    return [pytest.param(c, id=c.id) for c in cases]


def result_rows(table: pa.Table, names: Sequence[str]) -> list[tuple[Any, ...]]:
    """The rows, columns by position (two tables' `id` columns share a name, as in DuckDB)."""
    columns = [table.column(i).to_pylist() for i in range(len(names))]
    return list(zip(*columns, strict=True)) if table.num_rows else []


def assert_matches_oracle(result_table: pa.Table, oracle: OracleQuery) -> None:
    names, expected = evaluate(oracle)
    assert result_table.column_names == names
    got = result_rows(result_table, names)
    if oracle.limit is None:
        assert normalized(got) == normalized(expected)
        return
    assert len(got) == min(oracle.limit, len(expected))
    missing = Counter(normalized(got)) - Counter(normalized(expected))
    assert not missing, f"rows not in the full result: {sorted(missing)}"


# -- 1. every query agrees with the oracle ----------------------------------------------------------------


