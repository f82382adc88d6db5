"""Core's half of a split provider, proven without a cluster: an in-process provider that runs every
shard through the `local` provider answers the whole query set exactly as `local` does.

That is the contract any distributed provider builds on (quail-ray is one): the planner's partition,
`shard_request` for each shard, `merge_answers`, `finish` over whole tables, `limit_reached` to stop
a LIMIT early, and explain / report showing the shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pytest
from support.cases import CASE_BY_ID, CASES, assert_matches_oracle, keyword_session
from support.e2e_data import TABLES, arrow_table

import quail
from quail.backends.base import BackendExecutionContext
from quail.compute.base import Caller, ShardingProvider
from quail.compute.local import LocalProvider
from quail.compute.request import PhysicalRequest, PhysicalResponse, ShardMetrics
from quail.compute.sharding import (
    finish,
    limit_reached,
    merge_answers,
    merge_metrics,
    request_partition,
    scan_port,
    shard_request,
)
from quail.errors import ComputeError
from quail.planner.partition import plan_partition
from quail.serving import engines as serving
from quail.testing import ByteTokenizer, KeywordBackend

WORKERS = 3


class InProcessShards:
    """A test provider: shards one after another through `local`, in document order, stopping a LIMIT early."""

    name = "inprocess-shards"

    def __init__(self) -> None:
        self.local = LocalProvider()

    def planned_workers(self, config: quail.EngineConfig) -> int | None:
        return WORKERS

    def execute(self, request: PhysicalRequest, caller: Caller) -> PhysicalResponse:
        partition = request_partition(request, WORKERS)
        answers: dict = {}
        responses, shards, restrict = [], [], None
        for phase in partition.phases:
            answered = []
            for shard in phase.shards:
                response = self.local.execute(shard_request(request, phase, shard, answers), caller)
                answered.append((shard, response))
                shards.append(ShardMetrics(phase.index, shard.index, phase.alias, f"in-process {shard.worker}",
                                           shard.documents, shard.tokens, response.metrics.wall_s))
                so_far = {**answers, **merge_answers(request.graph, phase, answered)}
                covered = limit_reached(request, partition, phase, so_far, [s.index for s, _ in answered])
                if covered is not None:
                    restrict = {scan_port(request.graph, phase.alias): covered}
                    break
            answers.update(merge_answers(request.graph, phase, answered))
            responses.extend(response for _, response in answered)
        finished = finish(request, answers, restrict)
        return PhysicalResponse(finished.tables, merge_metrics(request.graph, responses, shards,
                                                               finished.node_metrics, 0.0))

    def close(self) -> None:
        self.local.close()


class ForgetfulBackend(KeywordBackend):
    """A third party's backend that runs every document whatever the request's known ports say."""

    name = "forgetful"

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        return serving.execute_request(self, replace(context, request=replace(context.request, known={})))


def sharded_session(backend: str = "keyword") -> quail.Session:
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(tokenizer))
    registry.register_backend(ForgetfulBackend(tokenizer))
    registry.register_compute(InProcessShards())
    session = quail.Session(quail.EngineConfig(backend=backend, compute="inprocess-shards"), registry=registry,
                            tokenizer=tokenizer)
    for name, (_, id_column) in TABLES.items():
        session.register(name, quail.DocumentProvider.from_table(arrow_table(name), id_column))
    return session


@pytest.fixture(scope="module")
def sessions() -> Iterator[tuple[quail.Session, quail.Session]]:
    with sharded_session() as sharded, keyword_session() as local:
        yield sharded, local


def sorted_answers(table: pa.Table) -> pa.Table:
    keys = [name for name in table.column_names if table.schema.field(name).type == pa.int32()]
    return table.sort_by([(k, "ascending") for k in keys + (["predicate"] if "predicate" in table.column_names
                                                                   else [])])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_shards_merged_answer_every_query_as_local_does(sessions, case):
    sharded, local = sessions
    mine, theirs = case.query(sharded).run(), case.query(local).run()
    assert mine.collect().equals(theirs.collect())
    assert_matches_oracle(mine.collect(), case.oracle)
    assert mine.report["shards"], "the run went through shards"
    if case.oracle.limit is None:
        assert mine.answer_tables.keys() == theirs.answer_tables.keys()
        for node, table in theirs.answer_tables.items():
            assert sorted_answers(mine.answer_tables[node]).equals(sorted_answers(table)), node
        assert mine.report["fresh_tokens"] >= theirs.report["fresh_tokens"]


def test_a_limit_stops_once_the_first_shards_hold_its_rows(sessions):
    sharded, local = sessions
    case = CASE_BY_ID["limit_filter"]
    result = case.query(sharded).run()
    assert result.collect().equals(case.query(local).collect())
    query = case.query(sharded)
    planned = plan_partition(query.plan().graph, query.prepared().tokens, WORKERS)
    assert len(result.report["shards"]) < len(planned.phases[0].shards), "later shards never ran"


def test_explain_shows_the_shards_and_their_balance_before_and_after_a_run(sessions):
    sharded, _ = sessions
    query = CASE_BY_ID["join_with_filters_on_both_sides"].query(sharded)
    assert isinstance(sharded.compute, ShardingProvider)
    planned = query.explain()
    assert "== Shards over workers ==" in planned
    assert "phase 0: filter_r — split on r; balance" in planned
    assert "phase 1: filter_a, join_0 — split on a" in planned
    assert "shard 0 → worker 0: rows" in planned
    measured = query.run().explain()
    assert "phase 1 shard 2 (split on a) on in-process 2:" in measured


def test_a_backend_that_ignores_known_ports_is_caught_not_counted_twice():
    ignored = "name documents outside it: the backend ignored the request's known"
    with sharded_session("forgetful") as session, pytest.raises(ComputeError, match=ignored):
        CASE_BY_ID["one_keyword_filter"].query(session).run()
