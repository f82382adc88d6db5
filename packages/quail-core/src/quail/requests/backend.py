"""What every request backend does the same way, whichever engine it drives.

A request backend (vLLM, SGLang) differs from another only in how it boots its engine and what it
asks of the machine; planning (the native planner's decisions, so comparisons between backends
compare execution), the checkpoint's tokenizer, the engine booted in `start()` and kept by the
shared `execute_request`, and the node-by-node execution are shared here, so an adapter package is
a `supports` check, a boot function and an engine adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from quail.backends.base import (
    BackendExecutionContext,
    GpuContext,
    ModelExecution,
    ModelIdentity,
    ModelRegion,
    PhysicalCandidate,
    PlanningContext,
    SupportResult,
)
from quail.catalog.devices import DeviceSpec
from quail.catalog.locations import local_model_directory
from quail.catalog.models import ModelSpec
from quail.compute.request import PhysicalResponse
from quail.config import EngineConfig
from quail.data.tokenizer import HuggingFaceTokenizer, Tokenizer
from quail.errors import Refusal, RefusalError
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.planner.calibration import calibrates
from quail.planner.physical import plan_query
from quail.prompts import answer_tokens, style_for
from quail.requests.engine import RequestEngine
from quail.requests.execution import REQUEST_NODES, RequestModelExecution
from quail.requests.strategies import RequestStrategy
from quail.serving import engines as serving

EngineFactory = Callable[[GpuContext], RequestEngine]
CHECKPOINT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                    "*.safetensors")
"""What a serving engine reads of a checkpoint directory."""


def installed(distribution: str) -> bool:
    """Whether a distribution is installed, without importing it (an engine import can take seconds)."""
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def checkpoint_tokenizer(model: ModelSpec) -> Tokenizer:
    """The checkpoint's tokenizer.json; Gemma puts its BOS token first, as in the native backend."""
    directory = local_model_directory(model)
    config = json.loads((directory / "config.json").read_text())
    bos = config.get("bos_token_id") if model.architecture == "gemma3" else None
    return HuggingFaceTokenizer(directory / "tokenizer.json", bos if isinstance(bos, int) else None)


class RequestBackend:
    """The backend contract for an engine behind `RequestEngine`; a subclass says what it supports.

    `boot` makes the engine (a fake one in tests). Two request backends with the same name,
    strategy and boot function are equal, so they share a booted engine across sessions.
    """

    def __init__(self, name: str, strategy: RequestStrategy, boot: EngineFactory) -> None:
        self.name = name
        self.strategy = strategy
        self.boot = boot

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, RequestBackend) and \
            (other.name, other.strategy, other.boot) == (self.name, self.strategy, self.boot)

    def __hash__(self) -> int:
        return hash((type(self), self.name, self.strategy, self.boot))

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        raise NotImplementedError

    def tokenizer(self, model: ModelSpec) -> Tokenizer:
        return checkpoint_tokenizer(model)

    def model_identity(self, model: ModelSpec, device: DeviceSpec, config: EngineConfig) -> ModelIdentity | None:
        """The checkpoint the engine loads, the configured precision and the device kind; None without weights here.

        The adapter (this backend's name, which Quail adds) resolves `precision="auto"` per device kind, so
        the configured value and the kind name the dtype it runs.
        """
        try:
            directory = local_model_directory(model)
        except RefusalError:
            return None
        files = tuple(sorted({p for pattern in CHECKPOINT_FILES for p in directory.glob(pattern)}))
        return ModelIdentity(files, (("precision", config.precision), ("device", device.kind)))

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        """The native planner's plan, with the TRUE/FALSE ids every request asks for in its model nodes."""
        if context.tokenizer is None:
            return Refusal("request planning needs the model's tokenizer, and none was given")
        labels = answer_tokens(context.tokenizer)  # refuses a tokenizer that cannot tell TRUE from FALSE
        style = style_for(context.model.chat_template, context.model.architecture)
        planned = plan_query(self.name, region, context, style, calibrate=calibrates(context), answers=labels)
        refusal = _refusal(planned.graph)
        return refusal if refusal is not None else [planned]

    def start(self, context: GpuContext) -> ModelExecution:
        """Boot the engine (timed as the query's boot); it lives as long as the worker keeps it."""
        return RequestModelExecution(self.boot(context), self.strategy)

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        return serving.execute_request(self, context)


def _refusal(graph: PhysicalGraph) -> Refusal | None:
    for node in graph.nodes:
        if isinstance(node, ph.AiClassify):
            return Refusal(
                "the request backends do not run AI.CLASSIFY",
                (f"{node.describe()}: a label's score is the summed log-probability of its whole continuation, "
                 "which one TRUE/FALSE request per document cannot read",),
                hints=("run classification on the native backend",),
            )
        if node.is_model_node and not isinstance(node, REQUEST_NODES):
            return Refusal(f"the request backends cannot run {node.kind} {node.id!r}")
    return None
