"""The `sglang` backend: one query's model work as token-id requests on SGLang with its radix cache.

It plans what the native backend plans (its filter order, join order and anchors), answers the
model nodes one by one as requests, and feeds them to the engine with pipelined filters (a document's next stage
is submitted with `async_generate` as soon as it answers TRUE, live documents capped by the KV
pool) and suffix-major joins when every anchor prefix fits the radix cache at once, anchor-major
otherwise: SGLang stores a prompt's KV in the radix tree only when its request finishes, so
anchor-major requests in flight together would each compute their anchor again.
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
from quail_sglang.engine import EngineSettings, SGLangEngine

ARCHITECTURES = ("qwen2", "qwen3", "gemma3")
INSTALL = "pip install 'quail-sglang[engine]'"
PIPELINED = RequestStrategy(filters="pipelined", joins="fit")
CONTEXT_HEADROOM = 7
"""SGLang refuses a prompt of `max_req_input_len` = min(context − 1, KV pool − 1) − 5 tokens or more:
a context of `chunk_tokens` + 7 takes every prompt the planner admits (at most `chunk_tokens`)."""


def boot_sglang(context: GpuContext) -> RequestEngine:
    """sglang.Engine on the session's model: the native backend's dtype, the configured KV budget."""
    try:
        import sglang  # noqa: F401
    except (ImportError, OSError, RuntimeError) as error:  # a CUDA build on a machine it cannot load on
        raise RefusalError(Refusal(
            f"SGLang cannot be imported: {error}",
            ("the engine (sglang, a CUDA build) is missing or broken on this machine",),
            hints=(INSTALL,),
        )) from error
    return SGLangEngine.boot(settings_for(context))


def settings_for(context: GpuContext) -> EngineSettings:
    """bf16 unless fp32 is asked for; `kv_budget_bytes` becomes a KV pool in tokens of that dtype."""
    config, model = context.config, context.model
    dtype = "float32" if config.precision == "fp32" else "bfloat16"
    kv_tokens = None
    if config.kv_budget_bytes is not None:
        per_token = 2 * model.layers * model.kv_heads * model.head_dim * (4 if dtype == "float32" else 2)
        kv_tokens = int(config.kv_budget_bytes // per_token)
    return EngineSettings(local_model_directory(model), dtype=dtype, kv_tokens=kv_tokens,
                          context_length=min(model.context_length, config.chunk_tokens + CONTEXT_HEADROOM))


class SGLangBackend(RequestBackend):
    """The request backend on SGLang; `boot` makes the engine (a fake one in tests)."""

    generates = True


    def __init__(self, name: str = "sglang", strategy: RequestStrategy = PIPELINED,
                 boot: EngineFactory = boot_sglang) -> None:
        super().__init__(name, strategy, boot)

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if model.architecture not in ARCHITECTURES:
            return SupportResult.reject(f"architecture {model.architecture!r} is not wired to SGLang here")
        if self.boot is not boot_sglang:
            return SupportResult.accept()
        if device.kind != "cuda":
            return SupportResult.reject("SGLang needs one CUDA GPU; its PyPI build does not run on CPU")
        if gpu_count != 1:
            return SupportResult.reject(f"runs on exactly one GPU; {gpu_count} were asked for")
        if not installed("sglang"):
            return SupportResult.reject(f"the engine (sglang) is not installed: {INSTALL}")
        return SupportResult.accept()
