"""SQL around the AI functions, end to end, against an independent oracle (DuckDB running the statement
with the AI functions as Python UDFs of the keyword rule; see relational_oracle.py).

The corpus mixes relational SQL and AI calls in both dialects: column predicates at the scan, AI calls
inside OR / NOT / CASE / SELECT / ORDER BY / GROUP BY / aggregates / HAVING / windows, DISTINCT,
LIMIT / OFFSET, CTEs and subqueries, joins (AI, equality, LEFT JOIN ON AI_FILTER, plain LEFT JOIN),
[NOT] EXISTS, NULL texts and numbers, empty strings, empty results and ties. Every statement runs through
the whole engine on the keyword backend and must return the oracle's rows (as multisets; in order where
its ORDER BY is total). Further tests check that the column predicates really run below the model, that
NULL texts cost no model work, and that errors come before any.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from support.relational_oracle import TABLES, oracle_rows, same_rows
from test_sql_corpus import TABLES as CORPUS_TABLES
from test_sql_corpus import VALID

import quail
from quail.physical import nodes as ph
from quail.testing import ByteTokenizer, KeywordBackend

SF, BQ = "snowflake", "bigquery"
ACTING = "'Does the review praise the \"acting\"? {0}'"
PLOT = "'Is {0} about the \"plot\"?'"
MUSIC = "'Does {0} mention \"music\"?'"
POSITIVE = "'How positive is {0}?'"
RECOMMEND = "'Would a critic recommend this film? {0}'"
DISCUSS = "'Does the review {0} discuss {1}?'"
SUPPORT = "'Does {0} support the claim {1}?'"
LABELS = "['acting', 'plot', 'music']"


def f(template: str, *columns: str, dialect: str = SF) -> str:
    name = "AI_FILTER" if dialect == SF else "AI.IF"
    return f"{name}(PROMPT({template}, {', '.join(columns)}))"


def s(template: str, column: str, dialect: str = SF) -> str:
    name = "AI_SCORE" if dialect == SF else "AI.SCORE"
    return f"{name}(PROMPT({template}, {column}))"


def k(column: str, dialect: str = SF, labels: str = LABELS) -> str:
    name = "AI_CLASSIFY" if dialect == SF else "AI.CLASSIFY"
    return f"{name}({column}, {labels})"


@dataclass(frozen=True)
class Case:
    id: str
    dialect: str
    sql: str
    ordered: bool = False


def sf(id: str, sql: str, ordered: bool = False) -> Case:
    return Case(id, SF, sql, ordered)


def bq(id: str, sql: str, ordered: bool = False) -> Case:
    return Case(id, BQ, sql, ordered)


R_ACTING, R_PLOT, R_MUSIC = f(ACTING, "r.body"), f(PLOT, "r.body"), f(MUSIC, "r.body")
B_ACTING, B_PLOT, B_MUSIC = (f(t, "r.body", dialect=BQ) for t in (ACTING, PLOT, MUSIC))
R_POSITIVE, B_POSITIVE = s(POSITIVE, "r.body"), s(POSITIVE, "r.body", BQ)
R_JOIN, B_JOIN = f(DISCUSS, "r.body", "a.aspect"), f(DISCUSS, "r.body", "a.aspect", dialect=BQ)
R_TOPIC, B_TOPIC = k("r.body"), k("r.body", BQ)

CASES: list[Case] = [
    # -- column predicates at the scan (every one AND-ed with an AI predicate) --------------------
    sf("scan_comparison", f"SELECT r.id, r.title FROM reviews r WHERE r.stars >= 5 AND {R_ACTING}"),
    bq("scan_between", f"SELECT r.id FROM reviews r WHERE r.stars BETWEEN 2 AND 4 AND {B_PLOT}"),
    sf("scan_in_list", f"SELECT r.id FROM reviews r WHERE r.genre_id IN (1, 3) AND {R_ACTING}"),
    bq("scan_not_in_list_with_null_genre", f"SELECT r.id FROM reviews r WHERE r.genre_id NOT IN (2) AND {B_PLOT}"),
    sf("scan_like", f"SELECT r.id FROM reviews r WHERE r.title LIKE 'Q%' AND {R_ACTING}"),
    sf("scan_ilike", f"SELECT r.id FROM reviews r WHERE r.title ILIKE '%heist%' AND {R_PLOT}"),
    sf("scan_is_null", f"SELECT r.id FROM reviews r WHERE r.stars IS NULL AND {R_MUSIC}"),
    bq("scan_is_not_null", f"SELECT r.id, r.year FROM reviews r WHERE r.year IS NOT NULL AND {B_ACTING}"),
    sf("scan_not", f"SELECT r.id FROM reviews r WHERE NOT (r.stars < 3) AND {R_ACTING}"),
    bq("scan_or_of_columns", f"SELECT r.id FROM reviews r WHERE (r.stars = 5 OR r.genre_id = 2) AND {B_MUSIC}"),
    sf("scan_function", f"SELECT r.id FROM reviews r WHERE LENGTH(r.body) > 50 AND {R_PLOT}"),
    bq("scan_upper", f"SELECT r.id FROM reviews r WHERE UPPER(r.title) LIKE '%DAYS%' OR {B_PLOT}"),
    sf("scan_in_subquery", "SELECT r.id FROM reviews r WHERE r.genre_id IN (SELECT g.genre_id FROM genres g "
       f"WHERE g.name <> 'drama') AND {R_ACTING}"),
    sf("scan_removes_every_row", f"SELECT r.id FROM reviews r WHERE r.stars > 10 AND {R_ACTING}"),
    bq("scan_constant_false", f"SELECT r.id FROM reviews r WHERE FALSE AND {B_ACTING}"),
    sf("scan_arithmetic", f"SELECT r.id FROM reviews r WHERE r.year + 1 >= 2022 AND {R_ACTING}"),
    sf("scan_in_an_inner_on", f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON a.weight >= 3 AND {R_JOIN}"),
    bq("scan_both_sides_of_an_ai_join", "SELECT r.id, a.aspect_id FROM reviews r, aspects a "
       f"WHERE r.stars >= 4 AND a.aspect IS NOT NULL AND {B_JOIN}"),
    sf("scan_uncorrelated_scalar_subquery", "SELECT r.id FROM reviews r WHERE r.stars >= (SELECT AVG(stars) "
       f"FROM reviews) AND {R_PLOT}"),
    sf("scan_correlated_exists_without_ai", "SELECT r.id FROM reviews r WHERE EXISTS (SELECT 1 FROM genres g "
       f"WHERE g.genre_id = r.genre_id AND g.name = 'thriller') AND {R_PLOT}"),
    # -- conditions across tables, equality joins --------------------------------------------------
    sf("cross_table_condition_after_an_ai_join",
       f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {R_JOIN} WHERE r.stars > a.weight"),
    sf("equality_join_with_a_plain_table", "SELECT r.id, g.name FROM reviews r JOIN genres g ON "
       f"r.genre_id = g.genre_id WHERE g.name = 'thriller' AND {R_PLOT}"),
    bq("comma_equality_join", "SELECT r.id, g.name FROM reviews r, genres g WHERE r.genre_id = g.genre_id "
       f"AND {B_ACTING} AND g.name IN ('drama', 'musical')"),
    # -- AI calls inside OR / NOT / CASE, as values ---------------------------------------------------
    sf("or_of_two_ai_filters", f"SELECT r.id FROM reviews r WHERE {R_ACTING} OR {R_MUSIC}"),
    bq("or_of_ai_and_column", f"SELECT r.id FROM reviews r WHERE {B_PLOT} OR r.stars = 1"),
    sf("not_ai_filter_drops_null_text", f"SELECT r.id FROM reviews r WHERE NOT {R_ACTING}"),
    bq("not_ai_filter_with_pushdown", f"SELECT r.id FROM reviews r WHERE NOT {B_MUSIC} AND r.stars >= 3"),
    sf("case_in_select", f"SELECT r.id, CASE WHEN {R_ACTING} THEN 'acting' WHEN {R_MUSIC} THEN 'music' "
       "ELSE 'other' END AS topic FROM reviews r"),
    bq("case_in_where", f"SELECT r.id FROM reviews r WHERE CASE WHEN r.stars >= 4 THEN {B_ACTING} "
       f"ELSE {B_PLOT} END"),
    sf("ai_filter_as_a_boolean_column", f"SELECT r.id, {R_ACTING} AS praises FROM reviews r"),
    bq("ai_filter_in_select_and_where", f"SELECT r.id, {B_ACTING} AS praises FROM reviews r WHERE {B_ACTING}"),
    sf("iff_over_an_ai_filter", f"SELECT r.id, IFF({R_MUSIC}, 'yes', 'no') AS m FROM reviews r "
       "WHERE r.stars IS NOT NULL"),
    sf("coalesce_of_a_verdict", f"SELECT r.id, COALESCE({R_ACTING}, FALSE) AS a FROM reviews r"),
    bq("verdict_is_null_for_null_text", f"SELECT r.id FROM reviews r WHERE {B_ACTING} IS NULL"),
    sf("null_text_reached_through_or", f"SELECT r.id FROM reviews r WHERE {R_ACTING} OR r.body IS NULL"),
    # -- AI.SCORE as a value -------------------------------------------------------------------------
    sf("score_in_select", f"SELECT r.id, {R_POSITIVE} AS s FROM reviews r"),
    bq("order_by_score_desc_limit", f"SELECT r.id, {B_POSITIVE} AS s FROM reviews r ORDER BY s DESC, r.id LIMIT 3",
       ordered=True),
    sf("order_by_score_expression", f"SELECT r.id FROM reviews r ORDER BY {R_POSITIVE} DESC NULLS LAST, r.id LIMIT 4",
       ordered=True),
    sf("score_threshold_at_the_top", f"SELECT r.id FROM reviews r WHERE {R_POSITIVE} >= 0.5"),
    bq("score_threshold_and_score_in_select",
       f"SELECT r.id, {B_POSITIVE} AS s FROM reviews r WHERE {B_POSITIVE} > 0.4"),
    sf("score_compared_with_a_column", f"SELECT r.id FROM reviews r WHERE {R_POSITIVE} * 5 >= r.stars"),
    bq("score_between", f"SELECT r.id FROM reviews r WHERE {B_POSITIVE} BETWEEN 0.3 AND 0.7"),
    sf("average_score", f"SELECT AVG({R_POSITIVE}) AS mean FROM reviews r WHERE r.stars >= 3"),
    bq("average_score_by_group", f"SELECT r.genre_id, AVG({B_POSITIVE}) AS mean, COUNT(*) AS n FROM reviews r "
       "GROUP BY r.genre_id ORDER BY r.genre_id", ordered=True),
    sf("min_and_max_of_one_call", f"SELECT MAX({R_POSITIVE}) AS hi, MIN({R_POSITIVE}) AS lo FROM reviews r"),
    bq("same_call_twice_in_select", f"SELECT r.id, {B_POSITIVE} AS a, {B_POSITIVE} + 1 AS b FROM reviews r"),
    sf("coalesce_of_a_score", f"SELECT r.id, COALESCE({R_POSITIVE}, -1) AS s FROM reviews r ORDER BY r.id",
       ordered=True),
    bq("rounded_score_with_pushdown", f"SELECT r.id, ROUND({s(RECOMMEND, 'r.body', BQ)}, 2) AS s FROM reviews r "
       "WHERE r.year >= 2020"),
    sf("score_of_null_and_empty_text", f"SELECT r.id, {R_POSITIVE} AS s FROM reviews r "
       "WHERE r.body IS NULL OR r.body = ''"),
    # -- AI.CLASSIFY as a value, GROUP BY ------------------------------------------------------------
    sf("group_by_classification", f"SELECT {R_TOPIC} AS topic, COUNT(*) AS n FROM reviews r GROUP BY topic"),
    bq("group_by_position_ordered", f"SELECT {B_TOPIC} AS topic, COUNT(*) AS n FROM reviews r GROUP BY 1 "
       "ORDER BY n DESC, topic", ordered=True),
    sf("classify_after_a_filter", f"SELECT r.id, {R_TOPIC} AS topic FROM reviews r WHERE {R_ACTING}"),
    sf("classify_label_filter_in_the_model", f"SELECT r.id, {R_TOPIC} AS topic FROM reviews r "
       "WHERE topic IN ('plot', 'music')"),
    bq("classify_not_in", f"SELECT r.id, {B_TOPIC} AS topic FROM reviews r WHERE topic NOT IN ('acting')"),
    sf("classify_compared", f"SELECT r.id FROM reviews r WHERE {R_TOPIC} = 'music'"),
    sf("classify_prompt_with_task_description", "SELECT r.id, AI_CLASSIFY(PROMPT('Topic of {0}', r.body), "
       f"{LABELS}, {{'task_description': 'pick one'}}) AS t FROM reviews r WHERE r.genre_id = 1"),
    bq("count_distinct_classes", f"SELECT COUNT(DISTINCT {B_TOPIC}) AS kinds FROM reviews r"),
    sf("having_over_a_classification", f"SELECT {R_TOPIC} AS topic, COUNT(*) AS n FROM reviews r GROUP BY topic "
       "HAVING COUNT(*) >= 3"),
    bq("classification_with_average_stars", f"SELECT {B_TOPIC} AS topic, AVG(r.stars) AS stars FROM reviews r "
       "WHERE r.stars IS NOT NULL GROUP BY topic"),
    sf("empty_string_is_a_document", f"SELECT r.id, {R_TOPIC} AS t FROM reviews r WHERE r.body = ''"),
    # -- aggregates and HAVING over AI values --------------------------------------------------------
    sf("count_if_over_a_filter", f"SELECT COUNT_IF({R_ACTING}) AS acting, COUNT(*) AS n FROM reviews r"),
    bq("sum_of_case_over_a_filter", f"SELECT r.genre_id, SUM(CASE WHEN {B_MUSIC} THEN 1 ELSE 0 END) AS m "
       "FROM reviews r GROUP BY r.genre_id"),
    sf("having_over_a_score", f"SELECT r.genre_id, COUNT(*) AS n FROM reviews r GROUP BY r.genre_id "
       f"HAVING MAX({R_POSITIVE}) > 0.6"),
    bq("having_that_keeps_nothing", f"SELECT r.genre_id, COUNT(*) AS n FROM reviews r WHERE {B_ACTING} "
       "GROUP BY r.genre_id HAVING COUNT(*) > 100"),
    sf("aggregates_over_nothing", f"SELECT COUNT(*) AS n, AVG({R_POSITIVE}) AS s FROM reviews r WHERE r.stars > 10"),
    # -- DISTINCT, ORDER BY, LIMIT, OFFSET -------------------------------------------------------------
    sf("distinct_after_a_filter", f"SELECT DISTINCT r.stars FROM reviews r WHERE {R_ACTING}"),
    bq("distinct_over_a_join", "SELECT DISTINCT g.name FROM reviews r JOIN genres g ON r.genre_id = g.genre_id "
       f"WHERE {B_PLOT}"),
    sf("order_by_with_ties_broken", f"SELECT r.title, r.id FROM reviews r WHERE {R_ACTING} ORDER BY r.title, r.id",
       ordered=True),
    bq("order_by_limit_offset", f"SELECT r.id FROM reviews r WHERE {B_ACTING} ORDER BY r.id LIMIT 2 OFFSET 1",
       ordered=True),
    sf("limit_without_order", f"SELECT r.id FROM reviews r WHERE {R_ACTING} LIMIT 3"),
    bq("limit_offset_without_order", f"SELECT r.id FROM reviews r WHERE {B_ACTING} LIMIT 2 OFFSET 1"),
    sf("order_desc_nulls_last", f"SELECT r.id, r.stars FROM reviews r WHERE NOT {R_MUSIC} "
       "ORDER BY r.stars DESC NULLS LAST, r.id", ordered=True),
    sf("renamed_and_computed_columns", f"SELECT r.id AS review, r.stars * 2 AS doubled, r.title || '!' AS t "
       f"FROM reviews r WHERE {R_ACTING}"),
    # -- windows and QUALIFY ---------------------------------------------------------------------------
    sf("row_number_over_a_score", f"SELECT r.id, ROW_NUMBER() OVER (ORDER BY {R_POSITIVE} DESC, r.id) AS place "
       "FROM reviews r WHERE r.body IS NOT NULL"),
    bq("rank_within_groups", "SELECT r.id, r.genre_id, RANK() OVER (PARTITION BY r.genre_id ORDER BY r.stars DESC) "
       f"AS rk FROM reviews r WHERE {B_ACTING}"),
    sf("qualify_best_per_group", "SELECT r.id, r.genre_id FROM reviews r WHERE r.stars IS NOT NULL QUALIFY "
       f"ROW_NUMBER() OVER (PARTITION BY r.genre_id ORDER BY {R_POSITIVE} DESC, r.id) = 1"),
    bq("window_sum_over_a_filter", f"SELECT r.id, SUM(CASE WHEN {B_ACTING} THEN 1 ELSE 0 END) OVER "
       "(PARTITION BY r.genre_id) AS c FROM reviews r"),
    # -- CTEs, subqueries, set operations --------------------------------------------------------------
    sf("cte_as_the_table_of_a_filter", "WITH good AS (SELECT * FROM reviews WHERE stars >= 4) SELECT g.id FROM good g "
       f"WHERE {f(ACTING, 'g.body')}"),
    bq("ai_block_in_a_cte", f"WITH scored AS (SELECT r.id, r.genre_id, {B_POSITIVE} AS s FROM reviews r) "
       "SELECT genre_id, COUNT(*) AS n FROM scored WHERE s > 0.5 GROUP BY genre_id"),
    sf("cte_joined_after_the_ai_block", "WITH g AS (SELECT genre_id, name FROM genres), hits AS (SELECT r.id, "
       f"r.genre_id FROM reviews r WHERE {R_PLOT}) SELECT g.name, COUNT(*) AS n FROM hits JOIN g "
       "ON hits.genre_id = g.genre_id GROUP BY g.name"),
    bq("subquery_as_the_table_of_a_filter", "SELECT t.id FROM (SELECT * FROM reviews WHERE year >= 2020) t "
       f"WHERE {f(ACTING, 't.body', dialect=BQ)}"),
    sf("ai_block_in_a_subquery", f"SELECT x.topic, COUNT(*) AS n FROM (SELECT {R_TOPIC} AS topic FROM reviews r "
       "WHERE r.stars >= 3) x GROUP BY x.topic"),
    sf("union_of_an_ai_block_and_a_plain_query",
       f"SELECT r.id FROM reviews r WHERE {R_ACTING} UNION SELECT r2.id FROM reviews r2 WHERE r2.stars = 1"),
    # -- joins ---------------------------------------------------------------------------------------
    sf("ai_join_with_a_scan_predicate", f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {R_JOIN} "
       "WHERE r.genre_id = 3"),
    bq("ai_join_grouped", f"SELECT a.aspect, COUNT(*) AS n FROM reviews r JOIN aspects a ON {B_JOIN} "
       "GROUP BY a.aspect"),
    sf("left_join_on_an_ai_filter", f"SELECT r.id, a.aspect FROM reviews r LEFT JOIN aspects a ON {R_JOIN}"),
    bq("left_join_counts_partners", f"SELECT r.id, COUNT(a.aspect_id) AS matched FROM reviews r LEFT JOIN aspects a "
       f"ON {B_JOIN} GROUP BY r.id"),
    sf("left_join_with_a_condition_on_the_joined_table", "SELECT r.id, a.aspect FROM reviews r LEFT JOIN aspects a "
       f"ON a.weight >= 3 AND {R_JOIN} WHERE r.stars >= 4"),
    sf("left_join_rows_without_a_partner", "SELECT r.id FROM reviews r LEFT JOIN aspects a "
       f"ON {R_JOIN} WHERE a.aspect_id IS NULL"),
    bq("plain_left_join_in_the_tail", "SELECT r.id, g.name FROM reviews r LEFT JOIN genres g ON "
       f"r.genre_id = g.genre_id WHERE {B_MUSIC}"),
    sf("plain_left_join_with_a_score", f"SELECT g.name, {R_POSITIVE} AS s FROM reviews r LEFT JOIN genres g "
       "ON r.genre_id = g.genre_id WHERE r.stars = 5"),
    sf("exists_with_an_ai_predicate", "SELECT c.claim_id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e "
       f"WHERE e.source = c.url AND {f(SUPPORT, 'e.passage', 'c.text')})"),
    bq("not_exists_keeps_null_text", "SELECT c.claim_id FROM claims c WHERE NOT EXISTS (SELECT 1 FROM evidence e "
       f"WHERE e.source = c.url AND {f(SUPPORT, 'e.passage', 'c.text', dialect=BQ)})"),
    sf("exists_with_inner_and_outer_scan_predicates", "SELECT c.claim_id FROM claims c WHERE c.url LIKE 'health%' "
       f"AND EXISTS (SELECT 1 FROM evidence e WHERE e.passage LIKE '%e%' AND {f(SUPPORT, 'e.passage', 'c.text')})"),
    bq("equality_restricted_ai_join", "SELECT c.claim_id, e.evidence_id FROM claims c JOIN evidence e "
       f"ON c.url = e.source AND {f(SUPPORT, 'e.passage', 'c.text', dialect=BQ)}"),
    sf("ai_join_then_a_score", f"SELECT r.id, a.aspect, {R_POSITIVE} AS s FROM reviews r JOIN aspects a "
       f"ON {R_JOIN} ORDER BY r.id, a.aspect", ordered=True),
    bq("ai_join_then_a_verdict_on_the_other_table", "SELECT r.id, a.aspect, "
       f"{f(MUSIC, 'a.aspect', dialect=BQ)} AS m FROM reviews r JOIN aspects a ON {B_JOIN}"),
    # -- SELECT lists ----------------------------------------------------------------------------------
    sf("star_exclude", f"SELECT * EXCLUDE (body) FROM reviews r WHERE {R_MUSIC}"),
    bq("star_with_pushdown", f"SELECT * FROM reviews r WHERE {B_PLOT} AND r.stars >= 2"),
    bq("star_except", f"SELECT * EXCEPT (body, year) FROM reviews r WHERE {B_MUSIC}"),
    sf("alias_star_over_a_join", f"SELECT a.*, r.id FROM reviews r JOIN aspects a ON {R_JOIN} WHERE a.weight > 2"),
    bq("ai_filter_removes_every_row", "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('Is {0} about \"zebras\"?', "
       "r.body))"),
]

# Statements of test_sql_corpus.py that the SQL front end refused before the relational tail existed.
ACCEPTED_ELSEWHERE = [
    "or_between_ai_predicates_becomes_two_boolean_columns", "left_outer_join_on_an_ai_predicate",
    "in_subquery_runs_at_the_scan", "subquery_in_from_is_scanned_by_duckdb", "with_clause_cte_is_a_table",
    "ai_block_inside_a_cte", "window_function_over_the_result", "group_by_with_count", "distinct",
    "having_over_a_group", "aggregate_in_select", "plain_alias_in_select", "ai_filter_in_select_is_a_boolean_column",
    "ai_filter_in_select_and_where_is_computed_once", "not_ai_filter", "score_compared_to_a_column",
    "score_compared_to_a_score", "score_equality_is_a_relational_condition",
    "score_unnamed_in_select_is_named_by_its_text", "classify_unnamed_in_select", "group_by_a_classification",
    "column_predicate_runs_at_the_scan", "column_predicate_in_an_inner_on_runs_at_the_scan",
    "uncorrelated_exists_around_an_ai_block", "star_exclude_around_ai", "bigquery_star_except_around_ai",
    "label_in_unnest_is_a_relational_condition", "qualify_over_a_window",
]


def keyword_session(tables: dict[str, pa.Table], calibration: str = "auto") -> quail.Session:
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(tokenizer))
    session = quail.Session(quail.EngineConfig(backend="keyword", calibration=calibration), registry=registry,
                            tokenizer=tokenizer)
    for name, table in tables.items():
        session.register(name, table)
    return session


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    """The corpus tables registered in as many ways as register() takes them."""
    with keyword_session({}) as s:
        s.register("reviews", quail.DocumentProvider.from_table(TABLES["reviews"], "id"))
        s.register("aspects", TABLES["aspects"])
        s.register("genres", TABLES["genres"].to_pandas())
        s.register("claims", ds.dataset(TABLES["claims"]))
        s.register("evidence", pa.RecordBatchReader.from_batches(TABLES["evidence"].schema,
                                                                 TABLES["evidence"].to_batches()))
        yield s


@pytest.fixture(scope="module")
def corpus_session() -> Iterator[quail.Session]:
    with keyword_session({n: pa.table(c) for n, c in CORPUS_TABLES.items()}) as s:
        yield s


def test_the_corpus_is_large_unique_and_covers_both_dialects():
    assert len(CASES) >= 80
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.dialect for c in CASES} == {SF, BQ}
    assert sum(c.ordered for c in CASES) >= 8
    assert {c.id for c in VALID} >= set(ACCEPTED_ELSEWHERE)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_statement_returns_the_oracles_rows(session, case: Case):
    got = session.sql(case.sql, dialect=case.dialect).run().collect()
    expected = oracle_rows(case.sql, case.dialect)
    problem = same_rows(got, expected, case.ordered)
    assert problem is None, f"{case.id}: {problem}"


@pytest.mark.parametrize("case_id", ACCEPTED_ELSEWHERE)
def test_statements_once_refused_return_the_oracles_rows(corpus_session, case_id: str):
    case = next(c for c in VALID if c.id == case_id)
    got = corpus_session.sql(case.sql, dialect=case.dialect).run().collect()
    expected = oracle_rows(case.sql, case.dialect, {n: pa.table(c) for n, c in CORPUS_TABLES.items()})
    problem = same_rows(got, expected, ordered=False)
    assert problem is None, f"{case_id}: {problem}"


def test_the_corpus_has_null_text_empty_text_and_empty_results(session):
    bodies = TABLES["reviews"].column("body").to_pylist()
    assert None in bodies and "" in bodies
    empty = [c for c in CASES if session.sql(c.sql, dialect=c.dialect).run().count() == 0]
    assert len(empty) >= 3


# -- below the model: column predicates run at the scan ---------------------------------------------


def _stage(result: quail.QueryResult, node: str) -> dict[str, object]:
    return next(s for s in result.report["stages"] if s["node"] == node)  # type: ignore[index,union-attr]


def test_a_column_predicate_runs_before_the_model_and_saves_tokens(session):
    five_stars = sum(1 for stars, body in zip(TABLES["reviews"].column("stars").to_pylist(),
                                               TABLES["reviews"].column("body").to_pylist(), strict=True)
                     if stars == 5 and body is not None)
    pushed = session.sql(f"SELECT r.id FROM reviews r WHERE r.stars >= 5 AND {R_ACTING}").run()
    everything = session.sql(f"SELECT r.id FROM reviews r WHERE {R_ACTING}").run()
    assert _stage(pushed, "filter_r")["evaluated"] == five_stars == 4
    assert _stage(everything, "filter_r")["evaluated"] == 13  # every review with text
    assert 0 < pushed.report["fresh_tokens"] < everything.report["fresh_tokens"] / 2
    assert set(pushed.to_pandas()["id"]) <= set(everything.to_pandas()["id"])
    assert "WHERE r.stars >= 5" in pushed.explain()


def test_the_planner_sees_the_rows_the_scan_keeps(session):
    query = session.sql(f"SELECT r.id FROM reviews r WHERE r.genre_id = 3 AND {R_ACTING}")
    assert query.views()["r"].num_rows == 5
    assert query.views()["r"].columns == ("id", "body")  # the id column, and the document column


@pytest.mark.parametrize("calibration", ["auto", "on"])
def test_a_predicate_that_removes_every_row_costs_no_model_token(calibration):
    with keyword_session(TABLES, calibration) as s:
        result = s.sql(f"SELECT r.id, {R_POSITIVE} AS p FROM reviews r WHERE r.year > 3000 AND {R_ACTING}").run()
        assert result.count() == 0
        assert result.report["fresh_tokens"] == 0
        assert all(m["fresh_tokens"] in (0, None) for m in result.report["node_metrics"].values())


def test_equal_views_are_tokenized_once(session):
    first = session.sql(f"SELECT r.id FROM reviews r WHERE r.stars >= 4 AND {R_ACTING}")
    second = session.sql(f"SELECT r.title FROM reviews r WHERE r.stars > 3 AND {R_MUSIC}")
    other = session.sql(f"SELECT r.title FROM reviews r WHERE r.stars > 4 AND {R_MUSIC}")
    views = [q.views()["r"] for q in (first, second, other)]
    assert views[0].identity != views[1].identity  # they read different columns ...
    assert views[0].column_identity("body") == views[1].column_identity("body")  # ... of the same documents
    assert views[0].column_identity("body") != views[2].column_identity("body")
    paths = [session.token_store.tokens(v, "body", session.tokenizer).path for v in views]
    assert paths[0] == paths[1] != paths[2]


# -- the model: AI calls become output columns, computed once ----------------------------------------


def test_an_ai_call_written_twice_is_computed_once(session):
    query = session.sql(f"SELECT r.id, {R_POSITIVE} AS a FROM reviews r WHERE {R_POSITIVE} > 0.2 "
                        f"ORDER BY {R_POSITIVE}")
    scores = [n for n in query.plan().graph.nodes if isinstance(n, ph.AiScore)]
    assert len(scores) == 1


def test_a_boolean_column_is_a_one_stage_filter_that_drops_no_row(session):
    query = session.sql(f"SELECT r.id, {R_ACTING} AS praises FROM reviews r")
    graph = query.plan().graph
    [model] = [n for n in graph.nodes if isinstance(n, ph.AiFilter)]
    assert len(model.stages) == 1
    assert any(isinstance(n, ph.RecombineVerdicts) for n in graph.nodes)
    result = query.run()
    assert result.count() == TABLES["reviews"].num_rows
    assert "margin" in result.answer_tables[model.id].column_names


def test_null_text_costs_no_model_work_and_is_counted(session):
    result = session.sql(f"SELECT r.id, {R_POSITIVE} AS s, {R_TOPIC} AS t FROM reviews r").run()
    rows = {row["id"]: row for row in result.to_rows()}
    assert rows[211]["s"] is None and rows[211]["t"] is None  # the NULL text
    assert rows[217]["s"] is not None  # the empty string is a document
    answered = result.answer_tables["score_s"].column("r").to_pylist()
    assert 5 not in answered and len(answered) == 13
    assert result.report["null_inputs"] == {"score_s": 1, "classify_t": 1}


def test_order_by_score_limit_scores_every_row_and_says_why(session):
    query = session.sql(f"SELECT r.id FROM reviews r ORDER BY {R_POSITIVE} DESC LIMIT 2")
    assert not any(isinstance(n, ph.Limit) for n in query.plan().graph.nodes)
    assert "LIMIT is applied after the relational part (ORDER BY needs every row)" in query.explain()
    result = query.run()
    assert result.answer_tables["score_ai_score_1"].num_rows == 13 and result.count() == 2


def test_a_plain_limit_stops_the_models_result_early(session):
    query = session.sql(f"SELECT r.id FROM reviews r WHERE {R_ACTING} LIMIT 2 OFFSET 1")
    [limit] = [n for n in query.plan().graph.nodes if isinstance(n, ph.Limit)]
    assert limit.count == 3


# -- errors come before any model work --------------------------------------------------------------


@pytest.mark.parametrize(("sql", "fragment", "line"), [
    (f"SELECT SUM(r.body)\nFROM reviews r WHERE {R_ACTING}", "sum(VARCHAR)", 1),
    (f"SELECT r.id FROM reviews r\nWHERE {R_ACTING}\nGROUP BY r.nope", "unknown column r.nope", 3),
    (f"SELECT r.id FROM reviews r WHERE {R_ACTING}\nORDER BY no_such_function(r.id)", "no_such_function", 2),
    (f"SELECT r.id FROM reviews r\nWHERE r.nope > 1 AND {R_ACTING}", "unknown column r.nope", 2),
])
def test_relational_errors_name_the_construct_before_any_token(sql: str, fragment: str, line: int):
    with keyword_session(TABLES) as s:
        backend = s.backend
        with pytest.raises(quail.CompileError) as info:
            s.sql(sql)
        assert fragment in str(info.value)
        assert info.value.line == line
        assert isinstance(backend, KeywordBackend) and backend.started == 0
        assert s.token_store.directory is None  # nothing was tokenized


# -- inputs: register() and results ------------------------------------------------------------------

SCORED = f"SELECT r.id, r.stars, {R_POSITIVE} AS s FROM reviews r WHERE r.stars >= 3 AND {R_ACTING} ORDER BY r.id"


def _registered(kind: str, tmp_path) -> object:
    table = TABLES["reviews"]
    if kind == "arrow_table":
        return table
    if kind == "record_batch_reader":
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=4))
    if kind == "dataset":
        return ds.dataset(table)
    if kind == "pandas":
        return table.to_pandas()
    if kind == "polars":
        polars = pytest.importorskip("polars")
        return polars.from_arrow(table)
    if kind == "duckdb_relation":
        import duckdb

        return duckdb.connect().from_arrow(table)
    if kind == "document_provider":
        return quail.DocumentProvider.from_table(table, "id")
    path = tmp_path / f"reviews.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind == "csv":
        import pyarrow.csv as pa_csv

        pa_csv.write_csv(table, path)
    elif kind == "jsonl":
        import json

        path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    elif kind == "duckdb":
        import duckdb

        connection = duckdb.connect(str(path))
        connection.register("source", table)
        connection.execute("CREATE TABLE reviews AS SELECT * FROM source")
        connection.close()
        return f"{path}:reviews"
    return path


@pytest.mark.parametrize("kind", ["arrow_table", "record_batch_reader", "dataset", "pandas", "polars",
                                  "duckdb_relation", "document_provider", "parquet", "csv", "jsonl", "duckdb"])
def test_register_takes_every_kind_of_input_and_answers_alike(kind, tmp_path):
    with keyword_session({}) as s:
        s.register("reviews", _registered(kind, tmp_path))
        got = s.sql(SCORED).run().collect()
    problem = same_rows(got, oracle_rows(SCORED, SF), ordered=True)
    assert problem is None, problem


def test_to_polars_gives_the_same_rows(session):
    polars = pytest.importorskip("polars")
    result = session.sql(SCORED).run()
    frame = result.to_polars()
    assert isinstance(frame, polars.DataFrame)
    assert frame.columns == result.collect().column_names
    assert frame.to_arrow().to_pylist() == result.to_rows()


def test_register_refuses_what_it_cannot_read():
    with keyword_session({}) as s:
        with pytest.raises(TypeError, match="register\\(\\) takes"):
            s.register("x", {"id": [1]})
        with pytest.raises(quail.CompileError, match="reserved"):
            s.register("__quail_rows_0", TABLES["genres"])
        with pytest.raises(quail.CompileError, match="id column 'genre' is missing"):
            s.register("genres", TABLES["genres"], id_column="genre")
        duplicated = pa.table({"id": [1, 1], "body": ["a", "b"]})
        with pytest.raises(quail.CompileError, match="repeats the value 1"):
            s.register("d", duplicated, id_column="id")


# -- a file changed since register -----------------------------------------------------------------

FILE_QUERY = f"SELECT r.id, r.body FROM reviews r WHERE {R_ACTING} ORDER BY r.id"


def _touch_later(path) -> None:
    import os

    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))


@pytest.mark.parametrize("as_provider", [False, True])
def test_a_file_changed_since_register_is_read_again(tmp_path, as_provider: bool):
    path = tmp_path / "reviews.parquet"
    pq.write_table(TABLES["reviews"], path)
    with keyword_session({}) as s:
        s.register("reviews", quail.DocumentProvider.from_parquet(path, "id") if as_provider else path,
                   id_column=None if as_provider else "id")
        query = s.sql(FILE_QUERY)
        before = query.run().to_rows()
        assert [row["id"] for row in before] == [201, 207, 213, 219, 223, 225, 227]
        changed = pa.table({"id": pa.array([1, 2], pa.int64()), "title": ["a", "b"],
                            "body": ["no praise here", "wonderful acting"], "stars": pa.array([1, 5], pa.int64()),
                            "genre_id": pa.array([1, 1], pa.int64()), "year": pa.array([2020, 2021], pa.int64())})
        pq.write_table(changed, path)
        _touch_later(path)
        assert query.run().to_rows() == [{"id": 2, "body": "wonderful acting"}]  # the same query, again
        assert s.sql(FILE_QUERY).run().to_rows() == [{"id": 2, "body": "wonderful acting"}]


@pytest.mark.parametrize("as_provider", [False, True])
def test_a_file_that_no_longer_validates_is_refused(tmp_path, as_provider: bool):
    path = tmp_path / "reviews.parquet"
    pq.write_table(TABLES["reviews"], path)
    with keyword_session({}) as s:
        s.register("reviews", quail.DocumentProvider.from_parquet(path, "id") if as_provider else path,
                   id_column=None if as_provider else "id")
        assert s.sql(FILE_QUERY).run().count() == 7
        duplicated = pa.concat_tables([TABLES["reviews"], TABLES["reviews"].slice(0, 1)])
        pq.write_table(duplicated, path)
        _touch_later(path)
        with pytest.raises(quail.CompileError, match=r"file changed since register.*repeats the value 201"):
            s.sql(FILE_QUERY).run()


@pytest.mark.parametrize("as_provider", [False, True])
def test_a_broken_file_fails_only_the_queries_that_read_it_and_is_read_again_once_fixed(tmp_path, as_provider):
    path, other = tmp_path / "reviews.parquet", tmp_path / "aspects.parquet"
    pq.write_table(TABLES["reviews"], path)
    pq.write_table(TABLES["aspects"], other)
    aspects = f"SELECT a.aspect_id FROM aspects a WHERE {f(ACTING.replace('review', 'aspect'), 'a.aspect')}"
    with keyword_session({}) as s:
        s.register("reviews", quail.DocumentProvider.from_parquet(path, "id") if as_provider else path,
                   id_column=None if as_provider else "id")
        s.register("aspects", other, id_column="aspect_id")
        expected = s.sql(aspects).run().to_rows()
        path.write_bytes(b"no longer a Parquet file")
        _touch_later(path)
        assert s.sql(aspects).run().to_rows() == expected, "a query over another table is not its concern"
        with pytest.raises(quail.CompileError, match=r"table 'reviews': its file changed since register"):
            s.sql(FILE_QUERY).run()
        s.register("critics", other, id_column="aspect_id")  # registering more still works
        pq.write_table(TABLES["reviews"], path)
        _touch_later(path)
        assert s.sql(FILE_QUERY).run().count() == 7


# -- property: any boolean mix of column predicates and AI filters answers like the oracle ------------

from hypothesis import HealthCheck, given, settings  # noqa: E402 - the property tests of this module
from hypothesis import strategies as st  # noqa: E402

COLUMN_ATOMS = ("r.stars >= 4", "r.stars < 3", "r.stars IS NULL", "r.genre_id IN (1, 2)", "r.title LIKE '%a%'",
                "r.body IS NULL", "r.year BETWEEN 2019 AND 2021", "LENGTH(r.body) > 45", "r.body = ''")
AI_ATOMS = (R_ACTING, R_PLOT, R_MUSIC, f"{R_POSITIVE} > 0.5")


def _conditions(depth: int) -> st.SearchStrategy[str]:
    atoms = st.sampled_from(COLUMN_ATOMS + AI_ATOMS)
    if depth == 0:
        return atoms
    inner = _conditions(depth - 1)
    return st.one_of(
        atoms,
        st.builds(lambda a, b: f"({a} AND {b})", inner, inner),
        st.builds(lambda a, b: f"({a} OR {b})", inner, inner),
        st.builds(lambda a: f"NOT ({a})", inner),
    )


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(top=st.lists(_conditions(2), min_size=0, max_size=3), ai=st.sampled_from(AI_ATOMS))
def test_any_mix_of_column_predicates_and_ai_filters_matches_the_oracle(session, top: list[str], ai: str):
    sql = f"SELECT r.id, r.stars FROM reviews r WHERE {' AND '.join([*top, ai])}"
    problem = same_rows(session.sql(sql).run().collect(), oracle_rows(sql, SF), ordered=False)
    assert problem is None, f"{sql}: {problem}"


def test_the_documented_examples_run_and_give_the_columns_they_show():
    """docs/sql.md shows two queries on Gemma 3 270M with their output, and the README a first join with examples:
    they stay valid SQL here."""
    import re
    from pathlib import Path

    from quail import datasets

    root = Path(__file__).parent.parent
    reference = root.joinpath("docs", "sql.md").read_text()
    section = reference[reference.index("Two examples on Gemma 3 270M"):]
    blocks = re.findall(r"```sql\n(.*?)```\n\n```\n(.*?)\n", section, re.DOTALL)
    assert len(blocks) == 2
    readme = root.joinpath("README.md").read_text()
    [first] = re.findall(r"```sql\n(.*?)```", readme[readme.index("## SQL you can write"):], re.DOTALL)[:1]
    with keyword_session({"reviews": datasets.reviews(), "aspects": datasets.aspects()}) as s:
        for (sql, header), dialect in zip(blocks, (SF, BQ), strict=True):
            result = s.sql(sql, dialect=dialect).run()
            assert result.collect().column_names == header.split()
            assert 0 < result.count() <= 5
        assert s.sql(first).run().collect().column_names == ["id", "aspect"]


@pytest.mark.parametrize("compute", ["local", "process"])
def test_the_relational_part_stays_with_the_caller_on_every_compute_provider(compute):
    """Scan views, NULL skipping and AI output columns work whichever side of the compute boundary runs
    the model part: only rows, tokens and key columns cross it; the tail runs where the query was asked."""
    sql = (f"SELECT r.id, {R_POSITIVE} AS s, r.title FROM reviews r WHERE r.stars >= 2 AND "
           f"({R_PLOT} OR r.body IS NULL) ORDER BY r.id")
    with quail.Session(quail.EngineConfig(backend="example-keyword", compute=compute)) as s:
        for name, table in TABLES.items():
            s.register(name, table)
        result = s.sql(sql).run()
    assert same_rows(result.collect(), oracle_rows(sql, SF), ordered=True) is None
    assert result.report["null_inputs"] == {"score_s": 1, "filter_ai_if_1": 1}


def test_a_plan_edited_to_show_the_model_a_null_document_is_refused(session):
    from quail.physical import editing

    query = session.sql(f"SELECT r.id, {R_POSITIVE} AS s FROM reviews r")
    graph = query.plan().graph
    [skip] = [n for n in graph.nodes if isinstance(n, ph.DropNullDocuments)]
    with pytest.raises(quail.PlanEditError, match="would read NULL documents of 'r'"):
        query.run(editing.remove(graph, skip.id))


def test_ctrl_c_during_a_duckdb_call_is_a_keyboard_interrupt_not_a_compile_error():
    """DuckDB turns Ctrl-C during its query into an interruption of the query: the caller must still see
    the KeyboardInterrupt (a CompileError would be caught as a user error, and the run go on)."""
    import duckdb

    from quail.data.database import translated

    with pytest.raises(KeyboardInterrupt), translated("the scan failed: "):
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")
    with pytest.raises(KeyboardInterrupt), translated():
        raise RuntimeError("Query interrupted")
    with pytest.raises(quail.CompileError, match="the scan failed: Binder Error"), translated("the scan failed: "):
        raise duckdb.BinderException("Binder Error: no such column")
