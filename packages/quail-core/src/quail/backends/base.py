"""The backend contract: what every inference backend implements, and the values it exchanges.

A backend is found by name in the ExtensionRegistry. The session asks `supports` when it is
created, the planner asks `plan` for candidates, and the runner either `start`s a
`ModelExecution` per device worker and runs model nodes one by one, or hands the whole graph to
`execute_request`.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import pyarrow as pa

from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig, Switch
from quail.data.tokenizer import Tokenizer
from quail.errors import Refusal
from quail.logical.nodes import LogicalNode
from quail.physical.graph import PhysicalGraph
from quail.physical.nodes import PhysicalNode

if TYPE_CHECKING:
    from quail.plugins.registry import ExtensionRegistry

OrderRule = Literal["by_cost", "as_written"]
PortRef = tuple[str, str]
"""(node id, port name) of a physical node's output."""


@dataclass(frozen=True)
class SupportResult:
    """A backend's answer to "can you run this model on this device?"."""

    accepted: bool
    reason: str | None = None

    @classmethod
    def accept(cls) -> SupportResult:
        return cls(accepted=True)

    @classmethod
    def reject(cls, reason: str) -> SupportResult:
        if not reason:
            raise ValueError("a rejection needs a reason the user can act on")
        return cls(accepted=False, reason=reason)


@dataclass(frozen=True)
class ModelRegion:
    """The part of the logical plan a model serves (today: the whole plan)."""

    root: LogicalNode


@dataclass(frozen=True)
class PlanningContext:
    """Everything a backend may consult while planning, and nothing it could change."""

    model: ModelSpec
    device: DeviceSpec
    gpu_count: int
    document_token_lengths: Mapping[str, Sequence[int]]
    order_rule: OrderRule = "by_cost"
    tokenizer: Tokenizer | None = None
    equality_pair_fractions: Mapping[tuple[str, str], float] = field(default_factory=dict)
    chunk_tokens: int = 2048
    kv_budget_bytes: float | None = None
    kv_page_tokens: int = 16
    prefix_sharing: Switch = "auto"
    document_shared_prefix_tokens: Mapping[str, int] = field(default_factory=dict)
    """Per alias: Σ whole pages each document shares with its predecessor in token order."""
    calibration: Switch = "auto"
    null_documents: Mapping[str, int] = field(default_factory=dict)
    """Per alias: rows whose document is NULL (no model work is spent on them; not in the lengths)."""


@dataclass(frozen=True)
class PhysicalCandidate:
    """One way to run a region: its graph, the logical plan it implements, its estimated time."""

    backend: str
    graph: PhysicalGraph
    plan: LogicalNode
    estimated_seconds: float
    sol_seconds: float | None = None
    remarks: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuContext:
    """One device worker: which device, which model, which index among `gpu_count`."""

    model: ModelSpec
    device: DeviceSpec
    device_index: int
    gpu_count: int
    config: EngineConfig


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


@dataclass(frozen=True)
class NodeOutput:
    """A model node's answer tables keyed by output port, and what it cost."""

    tables: Mapping[str, pa.Table]
    metrics: NodeMetrics


@runtime_checkable
class ModelExecution(Protocol):
    """A started backend on one device worker; runs model nodes one at a time.

    `inputs` holds the node's input ports by name, plus `documents:<alias>` for every alias whose
    documents the node reads: a table of `<alias>` (int32 row) and `tokens` (list<int32>).
    """

    def execute(self, node: PhysicalNode, inputs: Mapping[str, pa.Table]) -> NodeOutput: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExecutionMetrics:
    """What a backend measured. Unknown values are None, never 0."""

    wall_s: float
    fresh_tokens: int
    cached_tokens: int | None = None
    boot_s: float | None = None
    extra: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PhysicalResponse:
    """Arrow answer tables keyed by (node id, port), plus metrics."""

    tables: Mapping[PortRef, pa.Table]
    metrics: ExecutionMetrics


@dataclass(frozen=True)
class BackendExecutionContext:
    """The whole decoded graph with its inputs, for backends that run a graph at once.

    `runtime_state` survives across queries in one process: a booted engine lives there.
    """

    graph: PhysicalGraph
    inputs: Mapping[str, pa.Table]
    registry: ExtensionRegistry
    runtime_state: MutableMapping[str, object]
    config: EngineConfig
    model: ModelSpec
    device: DeviceSpec


@runtime_checkable
class TokenizerSource(Protocol):
    """Optional: a backend that can hand the session its model's tokenizer for planning."""

    def tokenizer(self, model: ModelSpec) -> Tokenizer: ...


@runtime_checkable
class ModelBackend(Protocol):
    """An inference backend, selected by `EngineConfig(backend=name)`."""

    name: str

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult: ...

    def plan(self, region: ModelRegion,
             context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal: ...

    def start(self, context: GpuContext) -> ModelExecution: ...

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse: ...
