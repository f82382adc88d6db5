"""The backend contract: what every inference backend implements, and the values it exchanges.

A backend is found by name in the ExtensionRegistry. The session asks `supports` when it is
created and the planner asks `plan` for candidates. The model part of the chosen plan then
crosses a compute provider's boundary as data (a `PhysicalRequest`), and on the far side the
provider calls the backend's `execute_request`, which boots the backend with `start` once per
worker (the engine is kept in `runtime_state`, so it outlives sessions) and runs the model nodes
through the generic runner. `quail.serving.engines.execute_request` is that shared
implementation; a backend may override it (and then answers no stored answers: the answer store
of `quail.cache` sits in that shared path).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import pyarrow as pa

from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.request import NodeMetrics, PhysicalRequest, PhysicalResponse, PortRef, TableInput
from quail.config import EngineConfig, Switch
from quail.data.tokenizer import TokenIds, Tokenizer
from quail.errors import Refusal
from quail.logical.expressions import AiPredicate
from quail.logical.nodes import LogicalNode
from quail.physical.graph import PhysicalGraph
from quail.physical.nodes import PhysicalNode
from quail.progress import ProgressListener

OrderRule = Literal["by_cost", "as_written"]
StagePrompt = tuple[AiPredicate, Callable[[TokenIds], TokenIds]]
"""A TRUE/FALSE predicate and its whole prompt as a function of one document's token ids."""


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
    question_first: Switch = "auto"
    """Whether a node asking one question may state it before the documents (`EngineConfig.question_first`)."""
    join_conditions: Switch = "auto"
    """Whether conditions between joined tables restrict the pairs the model is asked (`EngineConfig`)."""
    document_shared_prefix_tokens: Mapping[str, int] = field(default_factory=dict)
    """Per alias: Σ whole pages each document shares with its predecessor in token order."""
    calibration: Switch = "auto"
    stored_answers: StoredAnswers | None = None
    """What the answer store already holds (None when answers are not stored): priced at zero."""
    null_documents: Mapping[str, int] = field(default_factory=dict)
    """Per alias: rows whose document is NULL (no model work is spent on them; not in the lengths)."""


@runtime_checkable
class StoredAnswers(Protocol):
    """The answer store as the planner sees it: which prompts' readouts need no model work.

    Only prices come from here; the answers themselves are read again where the model nodes run.
    """

    def pending_stages(self, alias: str, stages: Sequence[StagePrompt]) -> list[list[int]]:
        """Per stage: the token lengths of the distinct documents of `alias` it still has to read —
        those whose readout is not stored, less those a stored FALSE of another stage drops."""
        ...

    def pending_labels(self, alias: str, prompt: Callable[[TokenIds], TokenIds],
                       labels: Sequence[TokenIds]) -> list[int]:
        """The token lengths of the distinct documents whose label log-probabilities are not stored."""
        ...

    def stored_share(self, aliases: Sequence[str], prompt: Callable[[Sequence[TokenIds]], TokenIds]) -> float:
        """An estimate (from a sample) of the fraction of tuples — one document per alias, in `aliases`
        order — whose TRUE/FALSE readout of `prompt(documents)` is stored."""
        ...


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
class NodeOutput:
    """A model node's answer tables keyed by output port, and what it cost."""

    tables: Mapping[str, pa.Table]
    metrics: NodeMetrics


@dataclass(frozen=True)
class NodeInputs:
    """What one model node reads: its input ports' row tables, and the documents they mention.

    `documents[alias]` is a table of `<alias>` (int32 row, ascending, distinct) and `tokens`
    (list<int32>) for every row of that alias that appears in the node's inputs.
    """

    ports: Mapping[str, pa.Table]
    documents: Mapping[str, pa.Table]

    def rows(self, alias: str, port: str = "rows") -> list[int]:
        """The distinct rows of `alias` in an input port, ascending."""
        return sorted(set(self.ports[port].column(alias).to_pylist()))

    def tokens(self, alias: str) -> dict[int, TokenIds]:
        """row → token ids of every document of `alias` the node reads."""
        table = self.documents[alias]
        rows = table.column(alias).to_pylist()
        return {r: tuple(t) for r, t in zip(rows, table.column("tokens").to_pylist(), strict=True)}

    @property
    def rows_in(self) -> int:
        return sum(table.num_rows for table in self.ports.values())


@runtime_checkable
class ModelExecution(Protocol):
    """A started backend on one device worker; runs model nodes one at a time."""

    def execute(self, node: PhysicalNode, inputs: NodeInputs) -> NodeOutput: ...

    def close(self) -> None: ...


@runtime_checkable
class ForgetsKV(Protocol):
    """Optional for a ModelExecution: drop every KV it keeps between queries (preambles, prefix caches), so
    the next query computes every prefix again — what a benchmark comparing engines cold needs."""

    def forget_kv(self) -> None: ...


@runtime_checkable
class DescribesEngine(Protocol):
    """Optional for a ModelExecution: what it decided when it booted (a precision chosen, a cache size),
    in words; every query it serves lists these among its report's remarks."""

    @property
    def notes(self) -> tuple[str, ...]: ...


class BackendLookup(Protocol):
    """What the worker side needs of an extension registry: the backend a request names."""

    def backend(self, name: str) -> ModelBackend: ...


RuntimeState = MutableMapping[Hashable, object]
"""Survives across queries (and sessions) in one worker process: booted engines live there."""


@dataclass(frozen=True)
class BackendExecutionContext:
    """A decoded request with what the worker process adds: the registry, its runtime state, progress.

    `runtime_state` survives across queries (and sessions) in one process: a booted engine lives there.
    """

    request: PhysicalRequest
    registry: BackendLookup
    runtime_state: RuntimeState
    progress: ProgressListener | None = None

    @property
    def graph(self) -> PhysicalGraph:
        return self.request.graph

    @property
    def outputs(self) -> tuple[PortRef, ...]:
        return self.request.outputs

    @property
    def known(self) -> Mapping[PortRef, pa.Table]:
        """Ports computed elsewhere (an earlier phase, a shard's Scan): the runner takes them as given."""
        return self.request.known

    @property
    def tables(self) -> Mapping[str, TableInput]:
        """Per alias: row count, token ids and key columns — the tokenized inputs."""
        return self.request.tables

    @property
    def config(self) -> EngineConfig:
        return self.request.config

    @property
    def model(self) -> ModelSpec:
        return self.request.model

    @property
    def device(self) -> DeviceSpec:
        return self.request.device

    def gpu_context(self, device_index: int = 0) -> GpuContext:
        return GpuContext(self.model, self.device, device_index, self.config.gpus, self.config)


@runtime_checkable
class TokenizerSource(Protocol):
    """Optional: a backend that can hand the session its model's tokenizer for planning."""

    def tokenizer(self, model: ModelSpec) -> Tokenizer: ...


@dataclass(frozen=True)
class ModelIdentity:
    """What a backend's readouts are a function of, besides the prompt: the basis of stored answers' keys.

    `files` are hashed by content (weights, tokenizer, config); `settings` name everything else that
    changes the numbers (precision, device kind, a rule's version). Quail adds the backend's name.
    """

    files: tuple[Path, ...]
    settings: tuple[tuple[str, str], ...]


@runtime_checkable
class ModelIdentitySource(Protocol):
    """Optional: a backend that can say what its readouts depend on, so they can be stored and reused.

    A backend without it (or returning None, e.g. when its weights cannot be found) gets no answer
    store: Quail never guesses that two runs computed the same numbers.
    """

    def model_identity(self, model: ModelSpec, device: DeviceSpec, config: EngineConfig) -> ModelIdentity | None: ...


@runtime_checkable
class ModelBackend(Protocol):
    """An inference backend, selected by `EngineConfig(backend=name)`."""

    name: str

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult: ...

    def plan(self, region: ModelRegion,
             context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal: ...

    def start(self, context: GpuContext) -> ModelExecution: ...

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse: ...
