"""End to end: SQL and builder queries run on the keyword test backend and agree with an oracle.

Every query of the corpus runs through the whole engine (front end, logical rules, planner,
physical graph, runner, Arrow relational operators, projection) on `KeywordBackend`, and its rows
are compared with `e2e_data.evaluate`, an independent nested-loop evaluation of the same query
over the Python rows. Further tests check the result API, the answer tables, the report, explain(),
plan editing and session hygiene.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cases import (
    ACTING,
    BQ,
    CASE_BY_ID,
    CASES,
    DISCUSS,
    JOIN_RA,
    MUSIC,
    PLOT,
    POSITIVE,
    RA,
    RECOMMEND,
    REVIEW_IDS,
    TOPICS,
    WORTH,
    P,
    R,
    _params,
    assert_matches_oracle,
    keyword_session,
    result_rows,
    sql_prompt,
)
from support.e2e_data import (
    Classify,
    OracleQuery,
    ScoreOut,
    arrow_table,
    evaluate,
    normalized,
    rows_of,
)

import quail
from quail.backends import shapes
from quail.physical import codecs, editing
from quail.physical import nodes as ph
from quail.testing import ByteTokenizer, KeywordBackend, KeywordExecution
from quail.testing.rules import predicate_margin


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with keyword_session() as s:
        yield s


@pytest.fixture
def fresh_session() -> Iterator[quail.Session]:
    with keyword_session() as s:
        yield s


def test_corpus_is_large_and_its_answers_are_mixed():
    """The corpus covers enough queries, and the data gives the keyword rule both answers."""
    assert len(CASES) >= 32
    for case in CASES:
        _, rows = evaluate(replace(case.oracle, limit=None))
        assert rows or case.may_be_empty, f"{case.id}: the oracle result is empty"
    reviews = rows_of("reviews")
    for template in (ACTING, PLOT, MUSIC, RECOMMEND, WORTH):
        answers = {predicate_margin(template, [r["body"]]) > 0 for r in reviews}
        assert answers == {True, False}, template
    pairs = {predicate_margin(DISCUSS, [r["body"], a["aspect"]]) > 0 for r in reviews for a in rows_of("aspects")}
    assert pairs == {True, False}


@pytest.mark.parametrize("case", _params(CASES))
def test_query_returns_the_oracle_rows(session, case):
    result = case.query(session).run()
    assert_matches_oracle(result.collect(), case.oracle)


MULTI_FILTER = ["two_filters", "three_filters", "three_filters_as_written", "join_with_filters_on_both_sides",
                "score_below_and_filter", "equality_restricted_join_reversed_with_filters"]


@pytest.mark.parametrize("case_id", MULTI_FILTER)
def test_order_as_written_and_by_cost_give_equal_rows(session, case_id):
    case = CASE_BY_ID[case_id]
    results = {}
    for order in ("as_written", "by_cost", None):
        query = session.sql(case.sql, dialect=case.dialect, order=order)
        results[order] = normalized(result_rows(query.collect(), query.collect().column_names))
        assert query.run().report["order_rule"] == (order or "by_cost")
    assert results["as_written"] == results["by_cost"] == results[None]


def test_order_as_written_keeps_the_written_filter_order(session):
    case = CASE_BY_ID["three_filters"]
    as_written = session.sql(case.sql, order="as_written").plan().graph.node("filter_r")
    assert [s.predicate.position for s in as_written.stages] == [0, 1, 2]


@pytest.mark.parametrize("sql_id, builder_id", [
    ("two_filters", "builder_two_filters"),
    ("join_with_filters_on_both_sides", "builder_join_with_filters_on_both_sides"),
    ("not_exists_with_filters_inside_and_outside", "builder_not_exists_with_filters"),
    ("classify_described_labels_in_bigquery", "builder_classify_described_labels_in"),
])
def test_builder_and_sql_spellings_give_equal_rows(session, sql_id, builder_id):
    by_sql = CASE_BY_ID[sql_id].query(session).collect()
    by_builder = CASE_BY_ID[builder_id].query(session).collect()
    assert by_sql.column_names == by_builder.column_names
    assert normalized(result_rows(by_sql, by_sql.column_names)) == normalized(
        result_rows(by_builder, by_builder.column_names))


def test_snowflake_and_bigquery_spellings_give_equal_rows(session):
    body = (f"SELECT r.id, a.aspect FROM reviews r, aspects a WHERE FN({sql_prompt(DISCUSS, 'r.body', 'a.aspect')})"
            f" AND FN({sql_prompt(PLOT, 'r.body')})")
    snowflake = session.sql(body.replace("FN", "AI_FILTER")).collect()
    bigquery = session.sql(body.replace("FN", "AI.IF"), dialect=BQ).collect()
    assert snowflake.equals(bigquery)


def test_a_query_runs_twice_with_equal_rows(session):
    query = CASE_BY_ID["join_with_filters_on_both_sides"].query(session)
    assert query.run().collect().equals(query.run().collect())


# -- 2. the result API ----------------------------------------------------------------------------------------


def test_collect_is_an_arrow_table_with_named_typed_columns(session):
    result = CASE_BY_ID["score_output_over_join_and_classify"].query(session).run()
    table = result.collect()
    assert isinstance(table, pa.Table)
    assert table.schema.names == ["topic", "id", "aspect", "salience"]
    assert table.schema.field("topic").type == pa.string()
    assert table.schema.field("id").type == pa.int64()
    assert table.schema.field("aspect").type == pa.string()
    assert table.schema.field("salience").type == pa.float64()
    assert all(0.0 < v < 1.0 for v in table.column("salience").to_pylist())


def test_select_star_keeps_every_column_and_type(session):
    table = CASE_BY_ID["select_star"].query(session).collect()
    source = arrow_table("reviews").schema
    assert table.schema.names == source.names
    assert [f.type for f in table.schema] == [f.type for f in source]


def test_to_rows_count_len_and_pandas_agree(session):
    result = CASE_BY_ID["join_full"].query(session).run()
    table = result.collect()
    rows = result.to_rows()
    assert rows == table.to_pylist()
    assert result.count() == len(result) == len(rows) == table.num_rows > 0
    assert rows[0].keys() == {"id", "aspect"}
    frame = result.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["id", "aspect"]
    assert frame.to_dict("records") == rows
    assert "rows" in repr(result)


@pytest.mark.parametrize("batch_rows", [1, 4, 1024])
def test_execute_stream_yields_batches_summing_to_count(session, batch_rows):
    result = CASE_BY_ID["join_full"].query(session).run()
    batches = list(result.execute_stream(batch_rows))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert all(b.num_rows <= batch_rows for b in batches)
    assert sum(b.num_rows for b in batches) == result.count()
    assert pa.Table.from_batches(batches, schema=result.collect().schema).equals(result.collect())


def test_empty_result_keeps_its_schema(session):
    result = CASE_BY_ID["limit_zero"].query(session).run()
    assert result.count() == len(result) == 0
    assert result.to_rows() == []
    assert result.collect().schema.names == ["id"]
    assert result.collect().schema.field("id").type == pa.int64()
    assert list(result.to_pandas().columns) == ["id"]
    assert sum(b.num_rows for b in result.execute_stream()) == 0


# -- 3. answer tables ---------------------------------------------------------------------------------------


def _answers_of_kind(result: Any, kind: str) -> dict[str, pa.Table]:
    return {k: t for k, t in result.answer_tables.items() if shapes.kind_of(t) == kind}


def test_filter_answers_include_documents_the_result_drops(session):
    result = CASE_BY_ID["two_filters"].query(session).run()
    (table,) = _answers_of_kind(result, "filter_answers").values()
    assert table.column_names == ["r", "predicate", "answer", "margin"]
    assert [f.type for f in table.schema] == [pa.int32(), pa.int32(), pa.bool_(), pa.float64()]
    ids = REVIEW_IDS
    answered = {ids[r] for r in table.column("r").to_pylist()}
    assert answered == set(ids), "every review gets a first-stage answer"
    false_ids = {ids[r] for r, a in zip(table.column("r").to_pylist(), table.column("answer").to_pylist(),
                                         strict=True) if not a}
    kept = set(result.collect().column("id").to_pylist())
    assert false_ids and not false_ids & kept
    # every stage answer agrees with the rule, and a document stops at its first FALSE
    reviews = rows_of("reviews")
    templates = {0: ACTING, 1: RECOMMEND}
    for row, predicate, answer, margin in zip(*(table.column(n).to_pylist() for n in table.column_names),
                                              strict=True):
        expected = predicate_margin(templates[predicate], [reviews[row]["body"]])
        assert math.isclose(margin, expected) and answer == (expected > 0)
    per_row = Counter(table.column("r").to_pylist())
    for row, count in per_row.items():
        answers = table.filter(pc.equal(table.column("r"), row)).column("answer").to_pylist()
        assert count == len(answers) and all(answers[:-1]) and (count == 2 or answers[-1] is False)


def test_filter_survivors_dropped_by_a_join_still_have_their_answers(session):
    case = CASE_BY_ID["join_with_filters_on_both_sides"]
    result = case.query(session).run()
    filters = _answers_of_kind(result, "filter_answers")
    assert set(filters) == {"filter_r", "filter_a"}
    passed_r = {REVIEW_IDS[r] for r, a in zip(filters["filter_r"].column("r").to_pylist(),
                                              filters["filter_r"].column("answer").to_pylist(), strict=True) if a}
    in_result = set(result.collect().column("id").to_pylist())
    assert in_result <= passed_r
    assert passed_r - in_result, "some review passes its filter but finds no aspect: it is dropped by the join"


def test_join_answers_have_the_standard_shape_and_metadata(session):
    result = CASE_BY_ID["join_anchored_on_aspects"].query(session).run()
    joins = _answers_of_kind(result, "join_answers")
    (table,) = joins.values()
    assert table.column_names == ["r", "a", "answer", "margin"] or table.column_names == ["a", "r", "answer", "margin"]
    assert table.schema.field("r").type == table.schema.field("a").type == pa.int32()
    assert table.schema.field("answer").type == pa.bool_()
    assert table.schema.field("margin").type == pa.float64()
    assert shapes.metadata_of(table, "anchor") == "a"
    assert json.loads(shapes.metadata_of(table, "partners")) == ["r"]
    assert shapes.metadata_of(table, "semantics") == "full"
    assert shapes.metadata_of(table, "position") == "0"
    assert table.num_rows == len(rows_of("reviews")) * len(rows_of("aspects"))
    assert 0 < pc.sum(table.column("answer").cast(pa.int64())).as_py() < table.num_rows
    assert pc.sum(table.column("answer").cast(pa.int64())).as_py() == result.count()


def test_exists_answers_are_anchored_on_the_outer_table(session):
    result = CASE_BY_ID["exists_with_filters_inside_and_outside"].query(session).run()
    (table,) = _answers_of_kind(result, "join_answers").values()
    assert shapes.metadata_of(table, "anchor") == "r"
    assert shapes.metadata_of(table, "semantics") == "exists"
    anti = CASE_BY_ID["not_exists_with_filters_inside_and_outside"].query(session).run()
    (table,) = _answers_of_kind(anti, "join_answers").values()
    assert shapes.metadata_of(table, "semantics") == "anti"


def test_equality_restricted_join_asks_only_equal_pairs(session):
    result = CASE_BY_ID["equality_restricted_join"].query(session).run()
    (table,) = _answers_of_kind(result, "join_answers").values()
    claims, evidence = rows_of("claims"), rows_of("evidence")
    asked = set(zip(table.column("c").to_pylist(), table.column("e").to_pylist(), strict=True))
    equal = {(i, j) for i, c in enumerate(claims) for j, e in enumerate(evidence) if c["url"] == e["source"]}
    assert asked == equal


def test_label_and_score_answers_have_the_standard_shape(session):
    result = CASE_BY_ID["score_output_over_join_and_classify"].query(session).run()
    (labels,) = _answers_of_kind(result, "labels").values()
    assert labels.column_names == ["r", "topic", "margins"]
    assert labels.schema.field("r").type == pa.int32()
    assert labels.schema.field("topic").type == pa.string()
    (scores,) = _answers_of_kind(result, "scores").values()
    assert scores.column_names == ["a", "salience", "margin"]
    assert scores.schema.field("salience").type == pa.float64()


def test_classify_answers_keep_rows_the_in_list_drops(session):
    result = CASE_BY_ID["classify_described_labels_in_bigquery"].query(session).run()
    (labels,) = _answers_of_kind(result, "labels").values()
    assert labels.num_rows == len(REVIEW_IDS)
    assert "acting" in labels.column("topic").to_pylist()
    assert "acting" not in result.collect().column("topic").to_pylist()


# -- 4. the report --------------------------------------------------------------------------------------------

REPORT_KEYS = {"backend", "model", "device", "wall_s", "estimated_seconds", "sol_seconds", "boot_s", "boot_kind",
               "fresh_tokens", "cached_tokens", "minimum_tokens", "stages", "node_metrics", "kv", "remarks",
               "order_rule"}


@pytest.mark.parametrize("case_id", ["two_filters", "join_with_filters_on_both_sides", "exists",
                                     "score_output_over_join_and_classify", "equality_restricted_join",
                                     "limit_zero"])
def test_report_has_every_key_and_unknowns_are_none(session, case_id):
    report = CASE_BY_ID[case_id].query(session).run().report
    assert set(report) >= REPORT_KEYS
    assert report["backend"] == "keyword"
    assert report["model"] == "gemma-3-270m"
    assert report["device"] == "cpu"
    assert report["wall_s"] > 0
    assert report["estimated_seconds"] > 0
    assert 0 < report["sol_seconds"] <= report["estimated_seconds"] * (1 + 1e-9)
    assert report["fresh_tokens"] > 0
    assert report["minimum_tokens"] > 0
    assert report["kv"] == {"hits": None, "misses": None, "evictions": None, "recomputed_tokens": None}
    assert report["remarks"] and all(isinstance(r, str) for r in report["remarks"])
    assert report["order_rule"] == "by_cost"
    json.dumps(report)  # plain values all the way down
    for node, metrics in report["node_metrics"].items():
        for key in ("kv_hits", "kv_misses", "kv_evictions", "recomputed_tokens", "chunks"):
            assert metrics[key] is None, f"{node}.{key} is not measured by the keyword backend"
        assert metrics["wall_s"] >= 0 and metrics["rows_out"] is not None


def test_report_node_metrics_cover_every_node_with_rows(session):
    query = CASE_BY_ID["join_with_filters_on_both_sides"].query(session)
    result = query.run()
    metrics = result.report["node_metrics"]
    graph = query.plan().graph
    assert set(metrics) == {n.id for n in graph.nodes}
    assert metrics[graph.root]["rows_out"] == result.count()
    for node in graph.nodes:
        if node.is_model_node:
            assert metrics[node.id]["fresh_tokens"] is not None
        else:
            assert metrics[node.id]["fresh_tokens"] is None, "a generic node has no token count"
    model = [metrics[n.id]["fresh_tokens"] for n in graph.nodes if n.is_model_node]
    assert result.report["fresh_tokens"] == sum(model)


def test_boot_is_cold_on_the_first_run_and_warm_on_the_second(fresh_session):
    quail.release_engines()
    query = CASE_BY_ID["one_keyword_filter"].query(fresh_session)
    first, again = query.run().report, query.run().report
    assert first["boot_kind"] == "cold"
    assert first["boot_s"] is not None and first["boot_s"] >= 0
    assert again["fresh_tokens"] == 0 and again["boot_kind"] is None, "every answer was stored: no engine needed"
    other = CASE_BY_ID["join_full"].query(fresh_session).run().report
    assert other["boot_kind"] == "warm"
    assert other["boot_s"] is None, "a warm run did not boot: its boot time is unknown/none, not 0"


def test_an_engine_outlives_its_session_and_serves_the_next_one():
    quail.release_engines()
    with keyword_session() as first:
        report = CASE_BY_ID["one_keyword_filter"].query(first).run().report
        assert report["boot_kind"] == "cold"
        booted = first.backend
    with keyword_session() as second:
        report = CASE_BY_ID["join_full"].query(second).run().report
        assert report["boot_kind"] == "warm" and report["boot_s"] is None
        assert second.backend is not booted and second.backend == booted, "an equal backend shares the engine"
    assert booted.started == 1
    quail.release_engines()
    with keyword_session() as third:  # a query with answers not stored yet: it needs an engine again
        assert CASE_BY_ID["two_filters"].query(third).run().report["boot_kind"] == "cold"


def test_stages_report_provided_observed_and_assumed_selectivity(session):
    result = CASE_BY_ID["two_filters"].query(session).run()
    stages = {s["position"]: s for s in result.report["stages"]}
    assert set(stages) == {0, 1}
    given, assumed = stages[1], stages[0]
    assert given["provided_selectivity"] == 0.5 and given["assumed_selectivity"] is False
    assert assumed["provided_selectivity"] is None and assumed["assumed_selectivity"] is True
    (table,) = _answers_of_kind(result, "filter_answers").values()
    for position, stage in stages.items():
        mine = table.filter(pc.equal(table.column("predicate"), position))
        assert stage["evaluated"] == mine.num_rows
        trues = sum(mine.column("answer").to_pylist())
        assert stage["observed_selectivity"] == pytest.approx(trues / mine.num_rows)
        assert stage["aliases"] == ["r"]


def test_join_stage_reports_its_pairs(session):
    result = CASE_BY_ID["join_anchored_on_reviews"].query(session).run()
    (stage,) = result.report["stages"]
    assert stage["provided_selectivity"] == 0.3 and not stage["assumed_selectivity"]
    assert set(stage["aliases"]) == {"r", "a"}
    assert stage["evaluated"] == len(REVIEW_IDS) * len(rows_of("aspects"))
    assert stage["observed_selectivity"] == pytest.approx(result.count() / stage["evaluated"])


def test_filter_only_query_never_reports_fewer_fresh_than_minimum_tokens(session):
    """The keyword backend pays every document again per stage: at or above the minimum."""
    report = CASE_BY_ID["three_filters"].query(session).run().report
    assert report["minimum_tokens"] <= report["fresh_tokens"]


# -- 5. explain --------------------------------------------------------------------------------------------

EXPLAIN_SQL = (f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
               f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}) "
               f"WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}, {{'selectivity': 0.5}}) "
               f"AND AI_FILTER({sql_prompt(RECOMMEND, 'r.body')})")


def test_explain_without_running_shows_plans_order_anchor_and_estimates(fresh_session):
    query = fresh_session.sql(EXPLAIN_SQL)
    text = query.explain()
    assert fresh_session.backend.started == 0, "explain() runs no model"
    assert "== Logical plan" in text and "SemanticJoin full" in text and "SemanticFilter r" in text
    assert "== Physical plan" in text and "AiFilter r" in text and "AiJoin full" in text
    graph = query.plan().graph
    order = " → ".join(f"#{s.predicate.position}" for s in graph.node("filter_r").stages)
    assert f"filter order on r: {order}" in text
    join = next(n for n in graph.nodes if isinstance(n, ph.AiJoin))
    assert f"anchor {join.anchor.alias}" in text
    assert f"anchors #{join.predicate.position} on {join.anchor.alias}" in text
    for node in graph.nodes:
        if node.is_model_node:
            line = next(x for x in text.splitlines() if f"[{node.id}]" in x and "shown above" not in x)
            assert " est " in line, f"no estimated seconds on {node.id}: {line}"
    assert "speed of light" in text and "estimated" in text
    assert "measured" not in text


def test_explain_analyze_and_result_explain_add_measurements(fresh_session):
    query = fresh_session.sql(EXPLAIN_SQL)
    analyzed = query.explain(analyze=True)
    assert "measured: wall" in analyzed and "speed of light" in analyzed
    result = query.run()
    measured = result.explain()
    for node in query.plan().graph.nodes:
        line = next(x for x in measured.splitlines() if f"[{node.id}]" in x and "shown above" not in x)
        assert "measured: wall" in line
        if node.is_model_node:
            assert " est " in line and "fresh tokens" in line
    root = next(x for x in measured.splitlines() if "[project]" in x)
    assert f"rows {result.count()}" in root


# -- 6. plan editing ---------------------------------------------------------------------------------------


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return normalized(result_rows(table, table.column_names))


def test_inserting_and_removing_a_barrier_keeps_the_rows(session):
    query = session.sql(EXPLAIN_SQL)
    graph = query.plan().graph
    expected = _rows(query.collect())
    with_barrier = editing.insert(graph, ph.Barrier("barrier_r"), after="survivors_r")
    assert any(isinstance(n, ph.Barrier) for n in with_barrier.nodes)
    assert _rows(query.run(plan=with_barrier).collect()) == expected
    without = editing.remove(with_barrier, "barrier_r")
    assert {n.id for n in without.nodes} == {n.id for n in graph.nodes}
    assert _rows(query.run(plan=without).collect()) == expected


def test_moving_a_limit_across_a_barrier_keeps_the_rows(session):
    case = CASE_BY_ID["limit_join"]
    query = case.query(session)
    graph = query.plan().graph
    feeding = graph.inputs_of("limit")["rows"].source
    with_barrier = editing.insert(graph, ph.Barrier("barrier"), after="limit")
    moved = editing.move(with_barrier, "limit", after=feeding)
    assert moved.inputs_of("barrier")["rows"].source == "limit"
    assert moved.inputs_of("limit")["rows"].source == feeding
    expected = query.collect()
    result = query.run(plan=moved)
    assert result.collect().equals(expected)
    assert_matches_oracle(result.collect(), case.oracle)
    assert "barrier" in result.report["node_metrics"]


def test_a_barrier_on_an_answers_edge_is_refused(session):
    graph = session.sql(EXPLAIN_SQL).plan().graph
    with pytest.raises(quail.PlanEditError, match="filter_answers"):
        editing.insert(graph, ph.Barrier("barrier"), after="filter_r")
    with pytest.raises(quail.PlanEditError, match="root"):
        editing.insert(graph, ph.Barrier("barrier"), after=graph.root)


def test_an_edited_graph_round_trips_through_the_codecs(session):
    query = session.sql(EXPLAIN_SQL)
    edited = editing.insert(query.plan().graph, ph.Barrier("barrier_r"), after="survivors_r")
    decoded = codecs.decode_graph(codecs.encode_graph(edited))
    assert decoded == edited
    assert query.run(plan=decoded).collect().equals(query.collect())


def test_running_another_querys_plan_is_a_clear_error(session):
    filter_only = CASE_BY_ID["one_keyword_filter"].query(session)
    join = CASE_BY_ID["join_full"].query(session)
    with pytest.raises(quail.QuailError):
        filter_only.run(plan=join.plan().graph)


def test_editing_a_model_node_raises_plan_edit_error(session):
    query = session.sql(EXPLAIN_SQL)
    graph = query.plan().graph
    model_nodes = [n for n in graph.nodes if n.is_model_node]
    assert model_nodes
    for node in model_nodes:
        with pytest.raises(quail.PlanEditError, match="model node"):
            editing.remove(graph, node.id)
        with pytest.raises(quail.PlanEditError, match="model node"):
            editing.move(graph, node.id, after="scan_r")
    with pytest.raises(quail.PlanEditError, match="model node"):
        editing.insert(graph, replace(graph.node("filter_r"), id="filter_again"), after="scan_r")
    assert _rows(query.run(plan=graph).collect()) == _rows(query.collect())


def test_a_graph_round_tripped_through_the_codecs_runs_with_equal_rows(session):
    for case_id in ("join_with_filters_on_both_sides", "equality_restricted_join",
                    "score_output_over_join_and_classify", "not_exists_with_filters_inside_and_outside",
                    "limit_classify_in"):
        case = CASE_BY_ID[case_id]
        query = case.query(session)
        graph = query.plan().graph
        text = codecs.encode_graph(graph)
        decoded = codecs.decode_graph(json.loads(json.dumps(text)))
        assert decoded == graph
        assert codecs.encode_graph(decoded) == text
        assert query.run(plan=decoded).collect().equals(query.collect())


# -- 7. session hygiene ---------------------------------------------------------------------------------------


def _token_files(directory: Path | None) -> list[Path]:
    return sorted(directory.glob("tokens-*")) if directory is not None else []


def test_close_removes_the_token_files():
    session = keyword_session()
    CASE_BY_ID["equality_restricted_join"].query(session).run()
    directory = session.token_store.directory
    assert directory is not None and len(_token_files(directory)) == 2
    session.close()
    assert session.closed
    assert not directory.exists()
    session.close()  # twice is fine


def test_close_removes_token_files_after_a_query_that_raised():
    session = keyword_session()
    long = "word " * 600
    session.register("long_docs", quail.DocumentProvider.from_table(pa.table({"k": [1, 2], "t": [long, "short"]}), "k"))
    query = session.sql(f"SELECT d.k FROM long_docs d WHERE AI_FILTER({sql_prompt(PLOT, 'd.t')})")
    with pytest.raises(quail.RefusalError, match="does not fit"):
        query.run()
    directory = session.token_store.directory
    assert _token_files(directory), "the refused query had tokenized its documents"
    session.close()
    assert not directory.exists()


def test_context_manager_removes_token_files_when_the_block_raises():
    with pytest.raises(RuntimeError, match="user code failed"), keyword_session() as session:
        CASE_BY_ID["one_keyword_filter"].query(session).run()
        directory = session.token_store.directory
        raise RuntimeError("user code failed")
    assert directory is not None and not directory.exists()


def test_a_closed_session_refuses_to_run_and_writes_no_files():
    session = keyword_session()
    query = CASE_BY_ID["join_full"].query(session)
    query.run()
    directory = session.token_store.directory
    session.close()
    with pytest.raises(quail.QuailError, match="closed"):
        query.run()
    with pytest.raises(quail.QuailError, match="closed"):
        CASE_BY_ID["one_keyword_filter"].query(session).run()
    assert directory is not None and not directory.exists()


class _Exploding:
    def __init__(self, inner: Any, fail_on: str) -> None:
        self.inner = inner
        self.fail_on = fail_on
        self.closed = False

    def execute(self, node: ph.PhysicalNode, inputs: quail.NodeInputs) -> Any:
        if node.kind == self.fail_on:
            raise RuntimeError(f"device lost while running {node.kind} {node.id}")
        return self.inner.execute(node, inputs)

    def close(self) -> None:
        self.closed = True


class _FailingBackend(KeywordBackend):
    """Plans like the keyword backend; its execution raises on one kind of model node."""

    name = "failing"

    def __init__(self, fail_on: str = "AiJoin") -> None:
        super().__init__(ByteTokenizer())
        self.fail_on = fail_on
        self.executions: list[_Exploding] = []

    def start(self, context: quail.GpuContext) -> _Exploding:
        execution = _Exploding(super().start(context), self.fail_on)
        self.executions.append(execution)
        return execution


def test_a_failing_backend_gives_a_clear_error_and_the_session_stays_usable():
    registry = quail.ExtensionRegistry.with_built_ins()
    backend = _FailingBackend()
    registry.register_backend(backend)
    session = keyword_session(registry, backend="failing")
    try:
        with pytest.raises(RuntimeError, match="device lost while running AiJoin"):
            CASE_BY_ID["join_full"].query(session).run()
        assert not session.closed
        case = CASE_BY_ID["two_filters"]
        assert_matches_oracle(case.query(session).collect(), case.oracle)
        with pytest.raises(RuntimeError, match="device lost"):
            CASE_BY_ID["exists"].query(session).run()
        case = CASE_BY_ID["classify"]
        assert_matches_oracle(case.query(session).collect(), case.oracle)
        directory = session.token_store.directory
        assert _token_files(directory)
        assert len(backend.executions) == 3, "an engine whose query failed is closed, never trusted again"
        assert [e.closed for e in backend.executions] == [True, True, False]
    finally:
        session.close()
    assert not directory.exists()
    quail.release_engines()
    assert all(e.closed for e in backend.executions)


# -- 8. user-chosen names that meet the engine's own column names -------------------------------------------
#
# Rows and answers travel as Arrow tables whose columns are named after table aliases and AI outputs,
# next to fixed columns (`predicate`, `answer`, `margin`, `margins`, `tokens`). A name the user may
# legally choose must either work or be refused at compile time with a CompileError, never crash in
# Arrow or return wrong rows.

NAME_CLASHES = [
    pytest.param(
        f"SELECT r.id, AI_SCORE({sql_prompt(POSITIVE, 'r.body')}) AS margin FROM reviews r "
        f"WHERE AI_FILTER({sql_prompt(PLOT, 'r.body')})",
        OracleQuery(R, ("r.id", "margin"), (P(PLOT, "r.body"),), scores=(ScoreOut(P(POSITIVE, "r.body"), "margin"),)),
        id="score_output_named_margin"),
    pytest.param(
        f"SELECT predicate.id FROM reviews predicate WHERE AI_FILTER({sql_prompt(PLOT, 'predicate.body')})",
        OracleQuery((("predicate", "reviews"),), ("predicate.id",), (P(PLOT, "predicate.body"),)),
        id="table_alias_named_predicate"),
    pytest.param(
        f"SELECT r.id, a.aspect, AI_CLASSIFY(r.body, ['acting', 'plot', 'music']) AS a FROM reviews r "
        f"JOIN aspects a ON AI_FILTER({JOIN_RA})",
        OracleQuery(RA, ("r.id", "a.aspect", "a"), (P(DISCUSS, "r.body", "a.aspect"),),
                    classifies=(Classify("r.body", TOPICS, "a"),)),
        id="classify_output_named_like_another_alias"),
    pytest.param(
        f"SELECT r.id, AI_SCORE({sql_prompt(POSITIVE, 'r.body')}) AS r FROM reviews r",
        OracleQuery(R, ("r.id", "r"), scores=(ScoreOut(P(POSITIVE, "r.body"), "r"),)),
        id="score_output_named_like_its_alias"),
    pytest.param(
        "SELECT r.id, AI_CLASSIFY(r.body, ['acting', 'plot', 'music']) AS margins FROM reviews r",
        OracleQuery(R, ("r.id", "margins"), classifies=(Classify("r.body", TOPICS, "margins"),)),
        id="classify_output_named_margins"),
    pytest.param(
        f"SELECT answer.id FROM reviews answer WHERE AI_FILTER({sql_prompt(PLOT, 'answer.body')})",
        OracleQuery((("answer", "reviews"),), ("answer.id",), (P(PLOT, "answer.body"),)),
        id="table_alias_named_answer"),
    pytest.param(
        f"SELECT margin.id, a.aspect FROM reviews margin JOIN aspects a "
        f"ON AI_FILTER({sql_prompt(DISCUSS, 'margin.body', 'a.aspect')})",
        OracleQuery((("margin", "reviews"), ("a", "aspects")), ("margin.id", "a.aspect"),
                    (P(DISCUSS, "margin.body", "a.aspect"),)),
        id="table_alias_named_margin_in_a_join"),
    pytest.param(
        f"SELECT tokens.id FROM reviews tokens WHERE AI_FILTER({sql_prompt(PLOT, 'tokens.body')})",
        OracleQuery((("tokens", "reviews"),), ("tokens.id",), (P(PLOT, "tokens.body"),)),
        id="table_alias_named_tokens"),
    pytest.param(
        f"SELECT r.id, AI_SCORE({sql_prompt(POSITIVE, 'r.body')}) AS answer FROM reviews r "
        f"WHERE AI_FILTER({sql_prompt(PLOT, 'r.body')})",
        OracleQuery(R, ("r.id", "answer"), (P(PLOT, "r.body"),), scores=(ScoreOut(P(POSITIVE, "r.body"), "answer"),)),
        id="score_output_named_answer"),
]


@pytest.mark.parametrize("sql, oracle", NAME_CLASHES)
def test_names_that_meet_internal_column_names_work_or_are_refused(session, sql, oracle):
    try:
        query = session.sql(sql)
    except quail.CompileError:
        return
    assert_matches_oracle(query.collect(), oracle)


class _Misshapen(KeywordExecution):
    """Answers filters without the margin column every filter answer table carries."""

    def execute(self, node: ph.PhysicalNode, inputs: quail.NodeInputs) -> Any:
        output = super().execute(node, inputs)
        return replace(output, tables={"answers": output.tables["answers"].drop_columns(["margin"])})


class _MisshapenBackend(KeywordBackend):
    name = "misshapen"

    def start(self, context: quail.GpuContext) -> _Misshapen:
        return _Misshapen(self._tokenizer)


@pytest.mark.parametrize("cache", ["off", "auto"])
def test_a_backend_answering_in_the_wrong_shape_is_named_with_its_node_and_the_shape_expected(cache):
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(_MisshapenBackend(ByteTokenizer()))
    with keyword_session(registry, backend="misshapen") as session:
        session.config = replace(session.config, cache=cache)
        with pytest.raises(RuntimeError, match=r"backend 'misshapen' answered AiFilter 'filter_r'.*'margin'"):
            CASE_BY_ID["one_keyword_filter"].query(session).run()
