"""The runner: the one interpreter of physical plans, on both sides of the compute boundary.

It runs the nodes that the requested output ports depend on, in topological order. Generic nodes
(Scan, HashJoin, Recombine*, DropNullDocuments, Limit, Barrier) run here with pyarrow,
the root Project (the relational tail) on DuckDB; model nodes run on a
started `ModelExecution`, with the documents they read attached as tokens. Far from the caller
(inside a backend's `execute_request`) its row sources are `TableInput`s sent as data; at the
caller they are the registered providers, and the tables the far side returned are `known`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from quail.backends import shapes
from quail.backends.base import ModelExecution, NodeInputs, NodeOutput
from quail.compute.request import NodeMetrics, PortRef
from quail.data import relational
from quail.data.relational import RowSource
from quail.data.tokens import TokenColumn
from quail.errors import PlanEditError
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.progress import ProgressListener, reporting

Observer = Callable[[ph.PhysicalNode, NodeMetrics], None]


@runtime_checkable
class Tail(Protocol):
    """Runs the root: the relational tail over the model's rows and the aliases' scan views."""

    def run(self, node: ph.Project, rows: pa.Table, views: Mapping[str, RowSource]) -> pa.Table: ...

    def decode(self, ids: Sequence[int]) -> str:
        """Generated token ids as text, with the tokenizer the query was planned with."""
        ...


@dataclass(frozen=True)
class RunInputs:
    """Where rows and tokens come from, per alias, and what runs the relational tail (at the caller only)."""

    tables: Mapping[str, RowSource]
    tokens: Mapping[str, TokenColumn]
    skipped: Mapping[str, pa.Array] = field(default_factory=dict)
    """Rows of an alias that its Scan leaves out (oversized documents under oversized_documents="skip")."""
    tail: Tail | None = None


@dataclass
class RunOutput:
    tables: dict[PortRef, pa.Table] = field(default_factory=dict)
    node_metrics: dict[str, NodeMetrics] = field(default_factory=dict)
    wall_s: float = 0.0


class Runner:
    """Runs what the requested ports need; `start` boots the model execution when a model node first runs."""

    def __init__(self, graph: PhysicalGraph, inputs: RunInputs,
                 start: Callable[[], ModelExecution] | None = None, *, backend: str = "?",
                 progress: ProgressListener | None = None, observers: Iterable[Observer] = ()) -> None:
        graph.validate()
        self.graph = graph
        self.inputs = inputs
        self.start = start
        self.backend = backend
        self.progress = progress
        self.observers = tuple(observers)
        self.values: dict[PortRef, pa.Table] = {}
        self._execution: ModelExecution | None = None

    def run(self, outputs: Sequence[PortRef], known: Mapping[PortRef, pa.Table] | None = None) -> RunOutput:
        """The tables of `outputs`; ports in `known` are taken as given and their producers never run."""
        started = time.perf_counter()
        self.values.update(known or {})
        output = RunOutput()
        needed = self.needed(outputs)
        for node in self.graph.topological_order():
            if node.id in needed:
                metrics = self._run_node(node)
                output.node_metrics[node.id] = metrics
                for observer in self.observers:
                    observer(node, metrics)
        output.tables = {port: self.values[port] for port in outputs}
        output.wall_s = time.perf_counter() - started
        return output

    def needed(self, outputs: Sequence[PortRef]) -> set[str]:
        """Ids of the nodes to run: producers of the outputs and, transitively, of their unknown inputs."""
        needed: set[str] = set()
        pending = [node for node, port in outputs if (node, port) not in self.values]
        while pending:
            node_id = pending.pop()
            if node_id in needed:
                continue
            needed.add(node_id)
            for edge in self.graph.inputs_of(node_id).values():
                if (edge.source, edge.source_port) not in self.values:
                    pending.append(edge.source)
        return needed

    def port_inputs(self, node: ph.PhysicalNode) -> dict[str, pa.Table]:
        return {port: self.values[(edge.source, edge.source_port)]
                for port, edge in self.graph.inputs_of(node.id).items()}

    def _run_node(self, node: ph.PhysicalNode) -> NodeMetrics:
        inputs = self.port_inputs(node)
        started = time.perf_counter()
        if node.is_model_node:
            result = self._execute_model_node(node, NodeInputs(inputs, self.documents(node, inputs)))
            self._store(node, result)
            return result.metrics
        table = self.generic(node, inputs)
        self.values[(node.id, next(iter(node.OUTPUTS)))] = table
        rows_in = sum(t.num_rows for t in inputs.values()) if inputs else None
        return NodeMetrics(time.perf_counter() - started, rows_in=rows_in, rows_out=table.num_rows)

    def execution(self) -> ModelExecution:
        if self._execution is None:
            if self.start is None:
                raise RuntimeError("this runner has no model execution: model nodes run behind a compute provider")
            self._execution = self.start()
        return self._execution

    def _execute_model_node(self, node: ph.PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        nothing = shapes.empty_answers(node) if any(t.num_rows == 0 for t in inputs.ports.values()) else None
        if nothing is not None:  # no row to read: no model work at all (not even calibration)
            return NodeOutput({"answers": nothing}, NodeMetrics(0.0, rows_in=0, rows_out=0, fresh_tokens=0,
                                                                cached_tokens=0))
        execution = self.execution()
        with reporting(execution, self._forward_progress(node)):
            return execution.execute(node, inputs)

    def _forward_progress(self, node: ph.PhysicalNode) -> Callable[[int, int], None] | None:
        listener = self.progress
        if listener is None:
            return None

        def forward(done: int, total: int) -> None:
            listener(node, done, total)

        return forward

    def _store(self, node: ph.PhysicalNode, result: NodeOutput) -> None:
        for port in node.OUTPUTS:
            table = result.tables.get(port)
            if not isinstance(table, pa.Table):
                raise RuntimeError(f"backend {self.backend!r} returned no {port!r} table for {node.kind} {node.id!r}")
            problem = shapes.shape_problem(node, table)
            if problem is not None:
                raise RuntimeError(f"backend {self.backend!r} answered {node.kind} {node.id!r} with a table of the "
                                   f"wrong shape: {problem}")
            self.values[(node.id, port)] = table

    def documents(self, node: ph.PhysicalNode, inputs: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
        """Per alias the node reads: the tokens of every row of that alias its inputs mention."""
        attached = {}
        for alias in node.document_aliases:
            rows = _distinct_rows(alias, inputs.values())
            tokens = self.inputs.tokens[alias].take(rows)
            if tokens.null_count or rows.null_count:
                raise PlanEditError(f"{node.kind} {node.id!r} would read NULL documents of {alias!r}: a plan "
                                    "skips them with a DropNullDocuments node before the model node (was it removed?)")
            attached[alias] = pa.table({alias: rows, "tokens": tokens})
        return attached

    def generic(self, node: ph.PhysicalNode, inputs: Mapping[str, pa.Table]) -> pa.Table:
        tables = self.inputs.tables
        if isinstance(node, ph.Scan):
            return relational.scan_rows(node.alias, tables[node.alias].num_rows, self.inputs.skipped.get(node.alias))
        if isinstance(node, ph.HashJoin):
            return relational.equality_pairs(inputs["left"], inputs["right"], node.equalities, tables, node.conditions)
        if isinstance(node, ph.RecombineFilter):
            return relational.survivors(inputs["rows"], inputs["answers"], node.alias)
        if isinstance(node, ph.RecombineJoin):
            return relational.recombine_join(inputs["left"], inputs["right"], inputs["answers"], node.semantics,
                                           inputs.get("candidates"))
        if isinstance(node, ph.RecombineLabels):
            return relational.add_labels(inputs["rows"], inputs["answers"], node.alias, node.output, node.allowed)
        if isinstance(node, ph.RecombineScores):
            return relational.add_scores(inputs["rows"], inputs["answers"], node.alias, node.output)
        if isinstance(node, ph.RecombineVerdicts):
            return relational.add_verdicts(inputs["rows"], inputs["answers"], node.alias, node.output)
        if isinstance(node, ph.RecombineTexts):
            return relational.add_generations(inputs["rows"], inputs["answers"], node.alias, node.output)
        if isinstance(node, ph.RecombineEmbeddings):
            return relational.add_embeddings(inputs["rows"], inputs["answers"], node.alias, node.output)
        if isinstance(node, ph.DropNullDocuments):
            present = relational.with_documents(self.inputs.tokens, node.aliases)
            return relational.present_documents(inputs["rows"], present, node.distinct)
        if isinstance(node, ph.Limit):
            return inputs["rows"].slice(0, node.count)
        if isinstance(node, ph.Barrier):
            return inputs["rows"].combine_chunks()
        if isinstance(node, ph.Project):
            if self.inputs.tail is None:
                raise RuntimeError("this runner has no relational tail: the root runs where the query was asked")
            texts = {n.output: n.schema for n in self.graph.nodes if isinstance(n, ph.RecombineTexts)}
            rows = relational.decode_texts(inputs["rows"], texts, self.inputs.tail.decode) if texts else inputs["rows"]
            return self.inputs.tail.run(node, rows, tables)
        raise TypeError(f"no runtime for {node.kind} {node.id!r}: is it a backend's node on the wrong backend?")


def _distinct_rows(alias: str, tables: Iterable[pa.Table]) -> pa.Array:
    chunks = [t.column(alias).combine_chunks() for t in tables if alias in t.column_names]
    if not chunks:
        return pa.array([], pa.int32())
    unique = pc.unique(pa.concat_arrays(chunks))
    return pc.take(unique, pc.sort_indices(unique))
