"""One model node's way through the answer store: lookups, bounded backend calls, answers to commit, counts.

The node kinds (`filters`, `joins`, `outputs`) decide what to ask; a `NodeRun` asks it: it reads the
store, runs part of the node on the backend (booting it on first need), keeps the calibration
offsets the backend measured, commits what each call answered, reports progress in items, and
adds the calls' metrics up into the node's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from quail.backends import shapes
from quail.backends.base import ModelExecution, NodeInputs
from quail.cache.access import StoredAnswerAccess
from quail.cache.keys import Key, Keys, ReadoutKind
from quail.cache.store import Answer, Readout
from quail.compute.request import NodeMetrics
from quail.logical.expressions import AiPredicate
from quail.physical import nodes as ph
from quail.progress import reporting

Item = TypeVar("Item")
Origin = int | tuple[int, ...] | None
"""The row (filters, outputs) or tuple (joins) whose backend call computed an answer; None when stored."""


class AnswerSource(Protocol):
    """Where a node run gets its answers (a `CachedExecution`): the store, and the backend booted on first need."""

    access: StoredAnswerAccess
    backend_name: str
    commit_tokens: int | None
    progress: Callable[[int, int], None] | None

    def backend(self) -> ModelExecution: ...


@dataclass(frozen=True)
class Found:
    """One answered prompt: the decision, the raw readout, whether it was read from the store, and (when
    computed) the item — row or tuple — whose backend call produced it."""

    answer: bool
    margin: float
    stored: bool
    origin: Origin = None


class NodeRun:
    """One model node's way through the store: lookups, backend calls, answers to commit, counts, progress."""

    def __init__(self, execution: AnswerSource, node: ph.PhysicalNode) -> None:
        self.execution = execution
        self.node = node
        self.consulted = execution.access.active
        """Whether the store was there when the node started (it may be dropped part-way: counts stay known)."""
        self.calls: list[NodeMetrics] = []
        self.offsets: dict[int, float] = {}
        self.pending: list[Answer] = []
        self.stored = 0
        self.computed = 0
        self.copied = 0
        self.done = 0
        self.total = 0

    @property
    def keys(self) -> Keys:
        return self.execution.access.keys

    def lookup(self, keys: Sequence[Key]) -> dict[Key, Readout]:
        return self.execution.access.get(keys)

    # -- decisions --------------------------------------------------------------------------------

    def known_offsets(self, node: ph.AiFilter | ph.AiJoin) -> dict[int, float]:
        """Per predicate position, the margin a TRUE must beat — 0 uncalibrated, else only what is stored."""
        prompts = node.calibration_prompts() if node.calibration else {}
        if not prompts:
            return {position: 0.0 for position in _positions(node)}
        keys = {position: self.keys.calibration(group) for position, group in prompts.items()}
        found = self.lookup(list(keys.values()))
        known = {p: found[k][0] for p, k in keys.items() if len(found.get(k, ())) == 1}
        self.offsets.update(known)
        return known

    @staticmethod
    def decided(predicate: AiPredicate, readout: Readout | None, offsets: Mapping[int, float]) -> Found | None:
        """A stored margin as an answer, or None when it is missing or its calibration offset is unknown."""
        if readout is None or len(readout) != 1 or predicate.position not in offsets:
            return None
        return Found(shapes.predicate_holds(predicate, readout[0], offsets[predicate.position]), readout[0], True)

    # -- backend calls ----------------------------------------------------------------------------

    def chunks(self, items: Sequence[Item], cost: Callable[[Item], int]) -> Iterator[list[Item]]:
        """Consecutive runs of items costing at most the commit budget each (at least one item per run)."""
        budget = self.execution.commit_tokens
        if budget is None:
            if items:
                yield list(items)
            return
        chunk: list[Item] = []
        spent = 0
        for item in items:
            price = cost(item)
            if chunk and spent + price > budget:
                yield chunk
                chunk, spent = [], 0
            chunk.append(item)
            spent += price
        if chunk:
            yield chunk

    def compute(self, node: ph.PhysicalNode, inputs: NodeInputs, items: int) -> pa.Table:
        """One backend call on part of this node; its calibration offsets are kept (and stored)."""
        backend = self.execution.backend()
        with reporting(backend, self._progress_within(items) if self.execution.progress is not None else None):
            output = backend.execute(node, inputs)
        table = output.tables.get("answers")
        problem = "no 'answers' table" if not isinstance(table, pa.Table) else shapes.shape_problem(node, table)
        if problem is not None or table is None:
            raise RuntimeError(f"backend {self.execution.backend_name!r} answered {node.kind} {node.id!r} with a "
                               f"table of the wrong shape: {problem} (every backend returns the standard shapes of "
                               "quail.backends.shapes)")
        self.calls.append(output.metrics)
        self._keep_offsets(node, output.metrics)
        self.advance(items)
        return table

    def _keep_offsets(self, node: ph.PhysicalNode, metrics: NodeMetrics) -> None:
        if not isinstance(node, ph.AiFilter | ph.AiJoin) or not node.calibration:
            return
        prompts = node.calibration_prompts()
        for position, offset in metrics.calibration_offsets or ():
            self.offsets[position] = offset
            if position in prompts:
                self.keep(self.keys.calibration(prompts[position]), "calibration", (offset,))

    def keep(self, key: Key, kind: ReadoutKind, value: Readout) -> None:
        self.pending.append(Answer(key, kind, value))

    def commit(self) -> None:
        """Store what the last call answered, as one transaction."""
        self.execution.access.put(self.pending)
        self.pending = []

    # -- progress ---------------------------------------------------------------------------------

    def begin(self, total: int, done: int) -> None:
        self.total, self.done = total, done
        self._report(done)

    def advance(self, items: int) -> None:
        self.done += items
        self._report(self.done)

    def _report(self, done: int) -> None:
        if self.execution.progress is not None:
            self.execution.progress(min(done, self.total), self.total)

    def _progress_within(self, items: int) -> Callable[[int, int], None]:
        before = self.done

        def forward(done: int, total: int) -> None:
            self._report(before + (items * done) // max(total, 1))

        return forward

    # -- the node's metrics -----------------------------------------------------------------------

    def count(self, stored: bool, own: bool) -> None:
        """Count one answer in the output: read from the store, computed for it, or copied from a duplicate."""
        if stored:
            self.stored += 1
        elif own:
            self.computed += 1
        else:
            self.copied += 1

    def metrics(self, wall_s: float, inputs: NodeInputs, table: pa.Table) -> NodeMetrics:
        calls = self.calls
        calibrated = isinstance(self.node, ph.AiFilter | ph.AiJoin) and bool(self.node.calibration)
        return NodeMetrics(
            wall_s, rows_in=inputs.rows_in, rows_out=table.num_rows,
            fresh_tokens=_total([c.fresh_tokens for c in calls], 0),
            cached_tokens=_total([c.cached_tokens for c in calls], 0),
            chunks=_total([c.chunks for c in calls], 0),
            model_flops=_total([c.model_flops for c in calls], 0.0),
            kv_hits=_total([c.kv_hits for c in calls], None),
            kv_misses=_total([c.kv_misses for c in calls], None),
            kv_evictions=_total([c.kv_evictions for c in calls], None),
            recomputed_tokens=_total([c.recomputed_tokens for c in calls], None),
            calibration_offsets=tuple(sorted(self.offsets.items())) if calibrated and self.offsets else None,
            stored_answers=self.stored if self.consulted else None,
            computed_answers=self.computed, duplicate_answers=self.copied,
        )


Number = TypeVar("Number", int, float)


def _total(values: Sequence[Number | None], nothing: Number | None) -> Number | None:
    """The sum over the backend's calls; None when one call did not measure it; `nothing` when there were none."""
    if not values:
        return nothing
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _positions(node: ph.AiFilter | ph.AiJoin) -> list[int]:
    return [s.predicate.position for s in node.stages] if isinstance(node, ph.AiFilter) else [node.predicate.position]


def representatives(rows: Sequence[int], documents: Mapping[int, tuple[int, ...]]) -> dict[int, list[int]]:
    """First row of each distinct document → every row with those tokens (duplicates are computed once)."""
    first: dict[tuple[int, ...], int] = {}
    groups: dict[int, list[int]] = {}
    for row in rows:
        representative = first.setdefault(documents[row], row)
        groups.setdefault(representative, []).append(row)
    return groups


def row_inputs(alias: str, rows: Sequence[int], inputs: NodeInputs) -> NodeInputs:
    """The node's inputs narrowed to `rows` of `alias` (and those documents only)."""
    chosen = pa.array(sorted(rows), pa.int32())
    documents = inputs.documents[alias]
    narrowed = documents.filter(pc.is_in(documents.column(alias), value_set=chosen))
    return NodeInputs({"rows": pa.table({alias: chosen})}, {alias: narrowed})
