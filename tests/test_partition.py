"""The planner's split of model work over workers (`quail.planner.partition`), without any cluster.

Shards are contiguous, cover every document once and are balanced by tokens — on the bundled
reviews and on a skewed table; prefix-sharing groups stay whole; a filter and the join anchored on
its survivors share a phase, a partner's filter runs in an earlier one; every query shape of the
corpus splits, and what cannot be split soundly runs unsplit with the reason said.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.cases import CASE_BY_ID, CASES, keyword_session

import quail
from quail import datasets
from quail.data.tokens import TokenColumn
from quail.physical import editing
from quail.physical import nodes as ph
from quail.planner.partition import key_alias, plan_partition, split_documents
from quail.planner.prefixes import plan_borrows
from quail.testing import ByteTokenizer, KeywordBackend

TOLERANCE = 1.1
"""The largest worker's tokens may exceed the mean by at most this factor."""


def column_of(lengths: list[int]) -> TokenColumn:
    tokens = pa.chunked_array([pa.array([[7] * n for n in lengths], pa.list_(pa.int32()))])
    return TokenColumn(Path("in-memory"), tokens)


def texts_column(texts: list[str]) -> TokenColumn:
    tokens = ByteTokenizer().encode_batch(texts)
    return TokenColumn(Path("in-memory"), pa.chunked_array([pa.array(tokens, pa.list_(pa.int32()))]))


def balance(lengths: list[int], workers: int) -> float:
    shards = split_documents(column_of(lengths), workers)
    totals = [sum(s.tokens for s in shards if s.worker == w) for w in range(workers)]
    return max(totals) / (sum(totals) / workers)


def rows_balanced(lengths: list[int], workers: int) -> float:
    """The balance a split by row counts would reach: what token balancing must beat."""
    size = -(-len(lengths) // workers)
    totals = [sum(lengths[i:i + size]) for i in range(0, len(lengths), size)]
    return max(totals) / (sum(lengths) / workers)


# -- shards ------------------------------------------------------------------------------------------------


@given(st.lists(st.integers(0, 300), max_size=60), st.integers(1, 6))
@settings(max_examples=200, deadline=None)
def test_shards_are_contiguous_and_cover_every_document_once(lengths, workers):
    shards = split_documents(column_of(lengths), workers)
    rows = [row for shard in shards for row in shard.rows().to_pylist()]
    assert rows == list(range(len(lengths)))
    assert all(len(shard.ranges) <= 1 for shard in shards)
    assert len(shards) == max(1, min(workers, len(lengths)))
    assert sum(s.tokens for s in shards) == sum(lengths)
    assert {s.worker for s in shards} <= set(range(workers))


@given(st.lists(st.integers(1, 50), min_size=1, max_size=9), st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_the_largest_shard_is_as_small_as_any_contiguous_split_allows(lengths, workers):
    largest = max(s.tokens for s in split_documents(column_of(lengths), workers))
    best = min(max(sum(lengths[a:b]) for a, b in itertools.pairwise((0, *cuts, len(lengths))))
               for parts in range(1, min(workers, len(lengths)) + 1)
               for cuts in itertools.combinations(range(1, len(lengths)), parts - 1))
    assert largest == best


@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("table", ["reviews", "labeled_reviews"])
def test_the_bundled_reviews_split_within_a_tenth_of_the_mean(table, workers):
    bodies = getattr(datasets, table)().column("body").to_pylist()
    column = texts_column(bodies)
    shards = split_documents(column, workers)
    totals = [sum(s.tokens for s in shards if s.worker == w) for w in range(workers)]
    assert max(totals) <= TOLERANCE * sum(totals) / workers


def test_a_skewed_table_splits_by_tokens_not_rows():
    """Three documents fifty times longer than the rest: a split by rows would be far off, by tokens it is not."""
    lengths = [50 * 40] * 3 + [40 + (i % 7) for i in range(200)]
    for workers in (2, 3, 4):
        assert balance(lengths, workers) <= TOLERANCE
        assert rows_balanced(lengths, workers) > 1.3


def test_a_cumulative_trace_stays_with_the_step_it_borrows_from():
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(tokenizer))
    config = quail.EngineConfig(backend="keyword", prefix_sharing="on", chunk_tokens=8192)
    with quail.Session(config, registry=registry, tokenizer=tokenizer) as session:
        session.register("traces", quail.DocumentProvider.from_table(datasets.traces(), "id"))
        query = session.sql("SELECT t.id FROM traces t WHERE AI_FILTER(PROMPT('Did the agent hit an error? {0}', "
                            "t.log))")
        graph, tokens = query.plan().graph, query.prepared().tokens
        assert any(isinstance(n, ph.AiFilter) and n.share_prefixes for n in graph.nodes)
        partition = plan_partition(graph, tokens, 2)
    [phase] = partition.phases
    where = {row: shard.index for shard in phase.shards for row in shard.rows().to_pylist()}
    _, borrows = plan_borrows(dict(enumerate(tokens["t"].tokens.to_pylist())), config.kv_page_tokens)
    sessions = datasets.traces().column("session").to_pylist()
    for borrow in borrows.values():
        if sessions[borrow.row] == sessions[borrow.lender]:
            assert where[borrow.row] == where[borrow.lender], borrow
    assert phase.balance(2) <= TOLERANCE
    assert sum(s.tokens for s in phase.shards) < tokens["t"].summary().total / 3, "borrowed prefixes are not counted"


# -- phases ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session():
    with keyword_session() as s:
        yield s


def partition_of(session, case_id, workers=2):
    query = CASE_BY_ID[case_id].query(session)
    return query.plan().graph, plan_partition(query.plan().graph, query.prepared().tokens, workers)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_query_shape_of_the_corpus_splits_with_each_model_node_in_one_phase(session, case):
    graph, partition = partition_of(session, case.id)
    assert partition.unsplit is None
    placed = [node for phase in partition.phases for node in phase.nodes]
    assert sorted(placed) == sorted(n.id for n in graph.nodes if n.is_model_node)
    for phase in partition.phases:
        assert all(key_alias(graph.node(node)) == phase.alias for node in phase.nodes)
    assert (partition.limit is not None) == (case.oracle.limit is not None)


def test_a_filter_and_the_join_anchored_on_its_survivors_share_a_phase(session):
    _, partition = partition_of(session, "select_star_over_join")
    assert [(p.alias, p.nodes) for p in partition.phases] == [("r", ("filter_r", "join_0"))]


def test_a_partners_filter_runs_in_an_earlier_phase_than_the_join(session):
    _, partition = partition_of(session, "join_with_filters_on_both_sides")
    assert [(p.alias, p.nodes) for p in partition.phases] == [("r", ("filter_r",)), ("a", ("filter_a", "join_0"))]


def test_two_joins_sharing_an_anchor_run_with_its_filter_in_one_phase(session):
    _, partition = partition_of(session, "two_joins_sharing_reviews")
    assert [(p.alias, p.nodes) for p in partition.phases] == [("r", ("filter_r", "join_1", "join_0"))]


def test_a_score_after_a_join_runs_in_a_later_phase_on_its_own_alias(session):
    _, partition = partition_of(session, "score_output_over_join_and_classify")
    assert [(p.alias, p.nodes) for p in partition.phases] == [("r", ("join_2", "classify_topic")),
                                                              ("a", ("score_salience",))]


def test_a_limit_asks_for_more_shards_than_workers(session):
    _, partition = partition_of(session, "limit_filter")
    assert partition.limit == 3
    assert len(partition.phases[0].shards) > partition.workers


@dataclass(frozen=True, kw_only=True)
class Reorder(ph.PhysicalNode):
    """A node of someone else's: the partitioner cannot tell what it does to the order of rows."""

    INPUTS: ClassVar[Mapping[str, ph.PortType]] = MappingProxyType({"rows": ph.PortType.ROWS})
    OUTPUTS: ClassVar[Mapping[str, ph.PortType]] = MappingProxyType({"rows": ph.PortType.ROWS})


def test_a_limit_after_a_node_the_planner_does_not_know_is_not_met_early(session):
    query = CASE_BY_ID["limit_filter"].query(session)
    edited = editing.insert(query.plan().graph, Reorder(id="reorder"), after="survivors_r")
    partition = plan_partition(edited, query.prepared().tokens, 2)
    assert partition.unsplit is None and partition.limit is None
    assert len(partition.phases[0].shards) == 2


def test_a_limit_before_model_work_runs_unsplit_and_says_why(session):
    query = CASE_BY_ID["one_keyword_filter"].query(session)
    edited = editing.insert(query.plan().graph, ph.Limit(id="early", count=2), after="scan_r")
    partition = plan_partition(edited, query.prepared().tokens, 2)
    assert partition.unsplit is not None and "Limit 'early' comes before model work" in partition.unsplit
    [phase] = partition.phases
    assert phase.alias is None and len(phase.shards) == 1
    assert any("unsplit" in line for line in partition.describe())
