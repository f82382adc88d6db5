"""What every request backend does the same way, whichever engine it drives.

A request backend (vLLM, SGLang) differs from another only in how it boots its engine and what it
asks of the machine; planning (the native planner's decisions folded into one RequestExecution),
the checkpoint's tokenizer, the engine kept in `runtime_state` and the metrics of a response are
shared here, so an adapter package is a `supports` check, a boot function and an engine adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from quail.backends.base import (
    BackendExecutionContext,
    ExecutionMetrics,
    GpuContext,
    ModelExecution,
    ModelRegion,
    PhysicalCandidate,
    PhysicalResponse,
    PlanningContext,
    SupportResult,
)
from quail.catalog.devices import DeviceSpec
from quail.catalog.locations import local_model_directory
from quail.catalog.models import ModelSpec
from quail.data.tokenizer import HuggingFaceTokenizer, Tokenizer
from quail.errors import Refusal
from quail.frontend.prompts import style_for
from quail.requests.engine import RequestEngine
from quail.requests.execution import RequestModelExecution, execute_requests
from quail.requests.node import RequestExecution, RequestStrategy
from quail.requests.planning import plan_requests

EngineFactory = Callable[[GpuContext], RequestEngine]


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

    `boot` makes the engine (a fake one in tests); the engine lives in `runtime_state` under
    `engine_key`, so every query of a process reuses it.
    """

    engine_key = "quail.requests.engine"

    def __init__(self, name: str, strategy: RequestStrategy, boot: EngineFactory) -> None:
        self.name = name
        self.strategy = strategy
        self.boot = boot

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        raise NotImplementedError

    def tokenizer(self, model: ModelSpec) -> Tokenizer:
        return checkpoint_tokenizer(model)

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        style = style_for(context.model.chat_template, context.model.architecture)
        planned = plan_requests(self.name, region, context, style, self.strategy)
        return planned if isinstance(planned, Refusal) else [planned]

    def start(self, context: GpuContext) -> ModelExecution:
        """Boot the engine now (the session times this as the query's boot); it lives until the session closes."""
        return RequestModelExecution(self.boot(context))

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        """Every RequestExecution of the graph, on the engine kept in `runtime_state` (booted on first use)."""
        engine = context.runtime_state.get(self.engine_key)
        if not isinstance(engine, RequestEngine):
            engine = self.boot(GpuContext(context.model, context.device, 0, context.config.gpus, context.config))
            context.runtime_state[self.engine_key] = engine
        tables = {}
        wall, fresh, cached = 0.0, 0, 0
        for node in context.graph.nodes:
            if isinstance(node, RequestExecution):
                output = execute_requests(engine, node, context.inputs)
                tables.update({(node.id, port): table for port, table in output.tables.items()})
                wall += output.metrics.wall_s
                fresh += output.metrics.fresh_tokens or 0
                cached += output.metrics.cached_tokens or 0
        return PhysicalResponse(tables, ExecutionMetrics(wall, fresh, cached))
