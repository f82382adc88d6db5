"""What crosses a compute provider's boundary: the model part of a query as data, and its answers as data.

A `PhysicalRequest` carries the plan (through codecs), each alias's token ids and hash-join keys as Arrow, and
the frozen specs; a `PhysicalResponse` carries the requested ports' Arrow tables and what running them cost.
Nothing here is a live object, so a request may go to another process or another machine unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import pyarrow as pa

from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig
from quail.data.providers import Columns, Rows
from quail.data.tokens import TokenColumn
from quail.physical.graph import PhysicalGraph

Number = TypeVar("Number", int, float)
BootKind = Literal["cold", "warm"]
PortRef = tuple[str, str]
"""(node id, port name) of a physical node's output."""


@dataclass(frozen=True)
class NodeMetrics:
    """What running one node cost. Unknown values are None, never 0."""

    wall_s: float
    rows_in: int | None = None
    rows_out: int | None = None
    fresh_tokens: int | None = None
    cached_tokens: int | None = None
    chunks: int | None = None
    model_flops: float | None = None
    """Dense plus attention FLOPs the backend computed (None when it cannot tell)."""
    kv_hits: int | None = None
    kv_misses: int | None = None
    kv_evictions: int | None = None
    recomputed_tokens: int | None = None
    calibration_offsets: tuple[tuple[int, float], ...] | None = None
    """(predicate position, mean margin on content-free documents) when the node was calibrated."""
    stored_answers: int | None = None
    """Answers read from the answer store instead of computed (None when the node did not consult it)."""
    computed_answers: int | None = None
    """Answers the backend computed in this run."""
    duplicate_answers: int | None = None
    """Answers copied from an identical prompt of the same node (duplicate documents, repeated tuples)."""


@dataclass(frozen=True)
class TableInput:
    """One alias on the far side of the compute boundary: data only, never a live provider.

    `tokens` holds the token ids of the column its prompts read (None when no prompt reads it);
    `keys` the columns its hash joins compare, one row per table row (no columns when none do).
    """

    alias: str
    num_rows: int
    tokens: TokenColumn | None
    keys: pa.Table
    left_out: pa.Array | None = None
    """Rows the query's scan leaves out (documents skipped as too long), None for none."""

    def take(self, rows: Rows, columns: Columns = None) -> pa.Table:
        """The key columns of `rows` (positions), as a DocumentProvider would return them."""
        names = self.keys.column_names if columns is None else [columns] if isinstance(columns, str) else list(columns)
        missing = [c for c in names if c not in self.keys.column_names]
        if missing:
            raise KeyError(f"alias {self.alias!r} was sent without the column(s) {missing} that the plan reads")
        indices = rows if isinstance(rows, pa.Array | pa.ChunkedArray) else pa.array(rows, pa.int32())
        return self.keys.select(names).take(indices)


@dataclass(frozen=True)
class PhysicalRequest:
    """The model part of a query as it crosses a compute provider's boundary: data only.

    The far side runs every node that `outputs` depend on and returns those ports' tables. Ports in
    `known` are taken as given and their producers never run: answers an earlier phase computed
    elsewhere, or a Scan restricted to the documents of one shard.
    """

    backend: str
    graph: PhysicalGraph
    outputs: tuple[PortRef, ...]
    tables: Mapping[str, TableInput]
    config: EngineConfig
    model: ModelSpec
    device: DeviceSpec
    known: Mapping[PortRef, pa.Table] = field(default_factory=dict)


@dataclass(frozen=True)
class ShardMetrics:
    """One shard of a query split over workers: which documents it held, where it ran, what it cost.

    `wall_s` is None for a shard cancelled before it answered (a LIMIT already had its rows).
    """

    phase: int
    shard: int
    alias: str | None
    """The alias whose documents were split; None when the plan ran unsplit."""
    worker: str
    documents: int
    tokens: int
    wall_s: float | None
    boot_s: float | None = None
    boot_kind: BootKind | None = None
    retries: int = 0
    cancelled: bool = False


@dataclass(frozen=True)
class ExecutionMetrics:
    """What a backend measured. Unknown values are None, never 0."""

    wall_s: float
    fresh_tokens: int | None
    cached_tokens: int | None = None
    boot_s: float | None = None
    boot_kind: BootKind | None = None
    nodes: Mapping[str, NodeMetrics] = field(default_factory=dict)
    """Per node id run on the far side, in the order they ran."""
    notes: tuple[str, ...] = ()
    """What the engine says of itself (`DescribesEngine`), for the report's remarks."""
    extra: Mapping[str, float] = field(default_factory=dict)
    shards: tuple[ShardMetrics, ...] = ()
    """Per shard when a provider split the work over workers (empty when it ran whole)."""


@dataclass(frozen=True)
class PhysicalResponse:
    """Arrow tables keyed by (node id, port) — every requested output — plus metrics."""

    tables: Mapping[PortRef, pa.Table]
    metrics: ExecutionMetrics


def sum_known(values: Sequence[Number | None]) -> Number | None:
    """The sum, or None when a value is unknown (an unknown is never counted as 0) or there is none."""
    return None if any(v is None for v in values) or not values else sum(v for v in values if v is not None)


def model_token_totals(graph: PhysicalGraph, metrics: Mapping[str, NodeMetrics]) -> tuple[int | None, int | None]:
    """(fresh, cached) tokens over the model nodes; None when a backend did not count them."""
    model = [metrics[n.id] for n in graph.nodes if n.is_model_node and n.id in metrics]
    if not model:
        return 0, 0
    return sum_known([m.fresh_tokens for m in model]), sum_known([m.cached_tokens for m in model])
