"""Running a partitioned request: each shard's request, the merge of their answers, the relational rest.

A provider that splits model work over workers (quail-ray) plans with `quail.planner.partition`,
sends every shard the request `shard_request` derives, and merges what comes back with the functions
here; only carrying requests and answers between machines, and choosing which worker runs a shard
now, are its own. The coordinator then runs the generic nodes over whole tables (`finish`), so the
rows are exactly what the unsplit plan would return.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from quail.compute.base import Caller
from quail.compute.request import (
    BootKind,
    ExecutionMetrics,
    NodeMetrics,
    PhysicalRequest,
    PhysicalResponse,
    PortRef,
    ShardMetrics,
    sum_known,
)
from quail.errors import ComputeError
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.planner.partition import Partition, Phase, Shard, key_alias, plan_partition
from quail.progress import ProgressListener
from quail.serving.runner import RunInputs, Runner, RunOutput

Answers = dict[PortRef, pa.Table]


def request_partition(request: PhysicalRequest, workers: int) -> Partition:
    """The partition of a request's model work (the same one `explain` shows for these workers)."""
    tokens = {alias: table.tokens for alias, table in request.tables.items() if table.tokens is not None}
    return plan_partition(request.graph, tokens, workers, page_tokens=request.config.kv_page_tokens)


def scan_port(graph: PhysicalGraph, alias: str) -> PortRef:
    """The output port of the Scan of `alias`: restricting it restricts everything that alias feeds."""
    for node in graph.nodes:
        if isinstance(node, ph.Scan) and node.alias == alias:
            return (node.id, "rows")
    raise ValueError(f"the plan has no Scan of alias {alias!r}")


def answer_ports(graph: PhysicalGraph, phase: Phase) -> tuple[PortRef, ...]:
    return tuple((node_id, port) for node_id in phase.nodes for port in graph.node(node_id).OUTPUTS)


def shard_request(request: PhysicalRequest, phase: Phase, shard: Shard, answers: Mapping[PortRef, pa.Table]) -> (
        PhysicalRequest):
    """What one worker runs for one shard: the phase's answers over the shard's documents, earlier answers given."""
    known = dict(answers)
    if phase.alias is not None:
        rows = shard.rows()
        left_out = request.tables[phase.alias].left_out
        if left_out is not None and len(left_out):  # documents skipped as too long stay out of every shard
            rows = rows.filter(pc.invert(pc.is_in(rows, value_set=left_out.cast(rows.type))))
        known[scan_port(request.graph, phase.alias)] = pa.table({phase.alias: rows})
    return replace(request, outputs=answer_ports(request.graph, phase), known=known)


def merge_answers(graph: PhysicalGraph, phase: Phase, answered: Sequence[tuple[Shard, PhysicalResponse]]) -> Answers:
    """Every answer table of the phase, the shards' tables concatenated in shard order.

    A shard's answers must lie within its documents: a backend that ignored the request's known
    ports (and answered every document) would otherwise count documents twice.
    """
    merged: Answers = {}
    ordered = sorted(answered, key=lambda item: item[0].index)
    for port in answer_ports(graph, phase):
        tables = []
        for shard, response in ordered:
            table = response.tables[port]
            alias = phase.alias if phase.alias in table.column_names else key_alias(graph.node(port[0]))
            if phase.alias is not None and alias is not None:
                _check_within(table, alias, shard, port)
            tables.append(table)
        if not tables:
            raise ComputeError(f"no shard answered {port[0]}.{port[1]}")
        merged[port] = pa.concat_tables(tables)
    return merged


def _check_within(table: pa.Table, alias: str, shard: Shard, port: PortRef) -> None:
    if table.num_rows and not pc.all(pc.is_in(table.column(alias), value_set=shard.rows())).as_py():
        raise ComputeError(f"the answers of {port[0]} for shard {shard.index} name documents outside it: the backend "
                           "ignored the request's known ports (run model nodes through "
                           "quail.serving.engines.execute_request, or honour BackendExecutionContext.known)")


def finish(request: PhysicalRequest, answers: Mapping[PortRef, pa.Table],
           restrict: Mapping[PortRef, pa.Table] | None = None) -> RunOutput:
    """The request's outputs from every model answer: the generic nodes run here, over whole tables
    (or over the Scans in `restrict`, when only some shards answered)."""
    skipped = {alias: table.left_out for alias, table in request.tables.items() if table.left_out is not None}
    runner = Runner(request.graph, RunInputs(request.tables, {}, skipped), backend=request.backend)
    return runner.run(request.outputs, known={**answers, **(restrict or {})})


def limit_reached(request: PhysicalRequest, partition: Partition, phase: Phase,
                  answers: Mapping[PortRef, pa.Table], finished: Iterable[int]) -> pa.Table | None:
    """The covered rows of `phase.alias` when the finished shards already decide a LIMIT, else None.

    Sound only when the finished shards are the first ones in document order, the phase is the last,
    and the rows reaching the Limit are ordered by that alias first (the runtime orders row tables by
    their columns, left to right): then the Limit's rows over the covered documents are the first
    rows of the whole result.
    """
    if partition.limit is None or phase.alias is None or phase is not partition.phases[-1]:
        return None
    done = set(finished)
    prefix = []
    for shard in sorted(phase.shards, key=lambda s: s.index):
        if shard.index not in done:
            break
        prefix.append(shard)
    if not prefix or len(prefix) == len(phase.shards):
        return None
    covered = pa.table({phase.alias: pa.concat_arrays([s.rows() for s in prefix])})
    feeding = _limit_input(request.graph)
    restricted = {scan_port(request.graph, phase.alias): covered}
    skipped = {alias: table.left_out for alias, table in request.tables.items() if table.left_out is not None}
    runner = Runner(request.graph, RunInputs(request.tables, {}, skipped), backend=request.backend)
    rows = runner.run([feeding], known={**answers, **restricted}).tables[feeding]
    leading = rows.column_names[0] if rows.column_names else None
    return covered if leading == phase.alias and rows.num_rows >= partition.limit else None


def _limit_input(graph: PhysicalGraph) -> PortRef:
    for node in graph.nodes:
        if isinstance(node, ph.Limit):
            edge = graph.inputs_of(node.id)["rows"]
            return (edge.source, edge.source_port)
    raise ValueError("the plan has no Limit")


# -- metrics ----------------------------------------------------------------------------------------


def shard_metrics(phase: Phase, shard: Shard, worker: str, response: PhysicalResponse | None,
                  retries: int = 0) -> ShardMetrics:
    """What one shard of a phase cost where it ran; a shard with no response was cancelled (a LIMIT had its rows)."""
    measured = response.metrics if response is not None else None
    return ShardMetrics(phase=phase.index, shard=shard.index, alias=phase.alias, worker=worker,
                        documents=shard.documents, tokens=shard.tokens,
                        wall_s=None if measured is None else measured.wall_s,
                        boot_s=None if measured is None else measured.boot_s,
                        boot_kind=None if measured is None else measured.boot_kind, retries=retries,
                        cancelled=response is None)


def merge_node_metrics(metrics: Sequence[NodeMetrics]) -> NodeMetrics:
    """One node's metrics over its shards: the longest wall (they ran side by side), counts summed
    (unknown if any shard did not count), calibration offsets from the first shard (all compute the same)."""
    values: dict[str, object] = {}
    for item in dataclasses.fields(NodeMetrics):
        column = [getattr(m, item.name) for m in metrics]
        if item.name == "wall_s":
            values[item.name] = max(column)
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in column):
            values[item.name] = sum(column)  # type: ignore[arg-type]
        else:
            values[item.name] = None if any(v is None for v in column) else column[0]
    return NodeMetrics(**values)  # type: ignore[arg-type]


def merge_metrics(graph: PhysicalGraph, answered: Sequence[PhysicalResponse], shards: Sequence[ShardMetrics],
                  generic: Mapping[str, NodeMetrics], wall_s: float) -> ExecutionMetrics:
    """The query's metrics: model nodes' from the shards that ran them, generic nodes' from the coordinator
    (`generic`: they ran there over whole tables), in plan order."""
    by_node: dict[str, list[NodeMetrics]] = {}
    for response in answered:
        for node_id, node_metrics in response.metrics.nodes.items():
            if graph.node(node_id).is_model_node:
                by_node.setdefault(node_id, []).append(node_metrics)
    nodes = {node.id: merge_node_metrics(by_node[node.id]) if node.id in by_node else generic[node.id]
             for node in graph.topological_order() if node.id in by_node or node.id in generic}
    boots = [r.metrics.boot_s for r in answered if r.metrics.boot_s is not None]
    extra: dict[str, float] = {}
    for response in answered:
        for key, value in response.metrics.extra.items():
            extra[key] = extra.get(key, 0.0) + value
    return ExecutionMetrics(
        wall_s=wall_s, fresh_tokens=sum_known([r.metrics.fresh_tokens for r in answered]),
        cached_tokens=sum_known([r.metrics.cached_tokens for r in answered]),
        boot_s=max(boots) if boots else None, boot_kind=_boot_kind([r.metrics.boot_kind for r in answered]),
        nodes=nodes, extra=extra,
        shards=tuple(shards),
    )


def _boot_kind(kinds: Sequence[BootKind | None]) -> BootKind | None:
    return "cold" if "cold" in kinds else "warm" if "warm" in kinds else None


# -- progress ---------------------------------------------------------------------------------------


@dataclass
class ShardProgress:
    """Folds the progress of shards running side by side into one count per node for the caller.

    A node's total is known only once every shard running it has reported; until then it is
    extrapolated from the shards that have, so a progress bar ends when the last shard does.
    """

    graph: PhysicalGraph
    listener: ProgressListener | None
    _counts: dict[tuple[str, int], tuple[int, int]] = dataclasses.field(default_factory=dict)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def report(self, node_id: str, shard: int, done: int, total: int, shards: int) -> None:
        """Shard `shard` (of `shards` running the node) has done `done` of its `total` items."""
        if self.listener is None:
            return
        with self._lock:
            self._counts[(node_id, shard)] = (done, total)
            mine = [count for (node, _), count in self._counts.items() if node == node_id]
        done_all, known = sum(d for d, _ in mine), sum(t for _, t in mine)
        expected = known if len(mine) >= shards else max(known * shards // len(mine), known + 1)
        self.listener(self.graph.node(node_id), done_all, expected)

    def finish(self, node_ids: Iterable[str]) -> None:
        """The nodes are answered (every shard returned, or the rest were cancelled): their counts end."""
        if self.listener is None:
            return
        for node_id in node_ids:
            with self._lock:
                mine = [count for (node, _), count in self._counts.items() if node == node_id]
            if mine:
                done = sum(d for d, _ in mine)
                self.listener(self.graph.node(node_id), done, done)


def progress_of(request: PhysicalRequest, caller: Caller) -> ShardProgress:
    return ShardProgress(request.graph, caller.progress)
