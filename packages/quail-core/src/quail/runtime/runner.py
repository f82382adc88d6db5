"""The runner: walks a physical graph in topological order; model nodes go to the backend.

Generic nodes (Scan, HashJoin, Recombine*, DropNullDocuments, Limit, Barrier) run here with pyarrow, the
root Project on DuckDB; model nodes run on the backend's ModelExecution, with the documents they read
attached as tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from quail.backends import shapes
from quail.backends.base import ModelExecution, NodeMetrics, NodeOutput
from quail.data.scan import RowSource
from quail.data.tokens import TokenColumn
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.runtime import relational
from quail.runtime.progress import ProgressAware, ProgressListener

Observer = Callable[[ph.PhysicalNode, NodeMetrics], None]


@runtime_checkable
class ReadsDocuments(Protocol):
    """A backend-owned model node (a RequestExecution, say) that names the aliases whose tokens it reads."""

    @property
    def document_aliases(self) -> tuple[str, ...]: ...


@runtime_checkable
class Tail(Protocol):
    """Runs the root: the relational tail over the model's rows and the aliases' scan views."""

    def run(self, node: ph.Project, rows: pa.Table, views: Mapping[str, RowSource]) -> pa.Table: ...


@dataclass(frozen=True)
class RunInputs:
    """Where rows and tokens come from, per alias (its scan view), and what runs the relational tail."""

    providers: Mapping[str, RowSource]
    tokens: Mapping[str, TokenColumn]
    tail: Tail


@dataclass
class RunOutput:
    table: pa.Table
    answer_tables: dict[str, pa.Table] = field(default_factory=dict)
    node_metrics: dict[str, NodeMetrics] = field(default_factory=dict)
    wall_s: float = 0.0


class Runner:
    def __init__(self, graph: PhysicalGraph, inputs: RunInputs, execution: ModelExecution,
                 observers: Iterable[Observer] = (), progress: Iterable[ProgressListener] = ()) -> None:
        graph.validate()
        self.graph = graph
        self.inputs = inputs
        self.execution = execution
        self.observers = tuple(observers)
        self.progress = tuple(progress)
        self.values: dict[tuple[str, str], pa.Table] = {}

    def run(self) -> RunOutput:
        started = time.perf_counter()
        output = RunOutput(pa.table({}))
        for node in self.graph.topological_order():
            metrics = self._run_node(node, output)
            output.node_metrics[node.id] = metrics
            for observer in self.observers:
                observer(node, metrics)
        output.table = self.values[(self.graph.root, "table")]
        output.wall_s = time.perf_counter() - started
        return output

    def port_inputs(self, node: ph.PhysicalNode) -> dict[str, pa.Table]:
        return {port: self.values[(edge.source, edge.source_port)]
                for port, edge in self.graph.inputs_of(node.id).items()}

    def _run_node(self, node: ph.PhysicalNode, output: RunOutput) -> NodeMetrics:
        inputs = self.port_inputs(node)
        started = time.perf_counter()
        if node.is_model_node:
            result = self._execute_model_node(node, inputs)
            self._store(node, result)
            for port, table in result.tables.items():
                output.answer_tables[f"{node.id}.{port}" if port != "answers" else node.id] = table
            return result.metrics
        table = self.generic(node, inputs)
        port = next(iter(node.OUTPUTS))
        self.values[(node.id, port)] = table
        rows_in = sum(t.num_rows for t in inputs.values()) if inputs else None
        return NodeMetrics(time.perf_counter() - started, rows_in=rows_in, rows_out=table.num_rows)

    def _execute_model_node(self, node: ph.PhysicalNode, inputs: dict[str, pa.Table]) -> NodeOutput:
        nothing = shapes.empty_answers(node) if any(t.num_rows == 0 for t in inputs.values()) else None
        if nothing is not None:  # no row to read: no model work at all (not even calibration)
            return NodeOutput({"answers": nothing}, NodeMetrics(0.0, rows_in=0, rows_out=0, fresh_tokens=0,
                                                                cached_tokens=0))
        execution = self.execution
        aware = isinstance(execution, ProgressAware) and bool(self.progress)
        if aware:
            execution.set_progress(self._forward_progress(node))
        try:
            return execution.execute(node, {**inputs, **self.documents(node, inputs)})
        finally:
            if aware:
                execution.set_progress(None)

    def _forward_progress(self, node: ph.PhysicalNode) -> Callable[[int, int], None]:
        def forward(done: int, total: int) -> None:
            for listener in self.progress:
                listener(node, done, total)

        return forward

    def _store(self, node: ph.PhysicalNode, result: NodeOutput) -> None:
        for port in node.OUTPUTS:
            if port not in result.tables:
                raise RuntimeError(f"backend returned no {port!r} table for {node.kind} {node.id!r}")
            self.values[(node.id, port)] = result.tables[port]

    def documents(self, node: ph.PhysicalNode, inputs: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
        """`documents:<alias>`: the tokens of every row of that alias the node's inputs mention."""
        attached = {}
        for alias in _document_aliases(node):
            rows = _distinct_rows(alias, inputs.values())
            tokens = self.inputs.tokens[alias].take(rows)
            attached[f"documents:{alias}"] = pa.table({alias: rows, "tokens": tokens})
        return attached

    def generic(self, node: ph.PhysicalNode, inputs: Mapping[str, pa.Table]) -> pa.Table:
        providers = self.inputs.providers
        if isinstance(node, ph.Scan):
            return relational.scan_rows(node.alias, providers[node.alias].num_rows)
        if isinstance(node, ph.HashJoin):
            return relational.equality_pairs(inputs["left"], inputs["right"], node.equalities, providers)
        if isinstance(node, ph.RecombineFilter):
            return relational.survivors(inputs["rows"], inputs["answers"], node.alias)
        if isinstance(node, ph.RecombineJoin):
            return relational.recombine_join(inputs["left"], inputs["right"], inputs["answers"], node.semantics)
        if isinstance(node, ph.RecombineLabels):
            return relational.add_labels(inputs["rows"], inputs["answers"], node.alias, node.output, node.allowed)
        if isinstance(node, ph.RecombineScores):
            return relational.add_scores(inputs["rows"], inputs["answers"], node.alias, node.output)
        if isinstance(node, ph.RecombineVerdicts):
            return relational.add_verdicts(inputs["rows"], inputs["answers"], node.alias, node.output)
        if isinstance(node, ph.DropNullDocuments):
            present = relational.with_documents(self.inputs.tokens, node.aliases)
            return relational.present_documents(inputs["rows"], present, node.distinct)
        if isinstance(node, ph.Limit):
            return inputs["rows"].slice(0, node.count)
        if isinstance(node, ph.Barrier):
            return inputs["rows"].combine_chunks()
        if isinstance(node, ph.Project):
            return self.inputs.tail.run(node, inputs["rows"], providers)
        raise TypeError(f"no runtime for {node.kind} {node.id!r}: is it a backend's node on the wrong backend?")


def _document_aliases(node: ph.PhysicalNode) -> list[str]:
    if isinstance(node, ph.AiJoin):
        return [node.anchor.alias, *(p.alias for p in node.partners)]
    if isinstance(node, ph.AiFilter | ph.AiClassify | ph.AiScore):
        return [node.alias]
    if isinstance(node, ReadsDocuments):
        return list(node.document_aliases)
    return []


def _distinct_rows(alias: str, tables: Iterable[pa.Table]) -> pa.Array:
    chunks = [t.column(alias).combine_chunks() for t in tables if alias in t.column_names]
    if not chunks:
        return pa.array([], pa.int32())
    unique = pc.unique(pa.concat_arrays(chunks))
    return pc.take(unique, pc.sort_indices(unique))
