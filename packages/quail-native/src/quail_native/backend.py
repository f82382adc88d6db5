"""The `native` backend: Quail's own executor behind the backend contract."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from quail import DeviceSpec, EngineConfig, ModelSpec
from quail.extend import (
    Backend,
    GpuContext,
    ModelExecution,
    ModelIdentity,
    SupportResult,
    Tokenizer,
    answer_tokens,
    checkpoint_tokenizer,
    embedding_identity,
)
from quail_native.embedding import embedding_support, start_embedding
from quail_native.precision_record import recall, record_path
from quail_native.precision_rule import unmeasured_precision

ARCHITECTURES = ("qwen2", "qwen3", "gemma3")
DEFAULT_KV_CHUNKS = 32
CHECKPOINT_FILES = ("config.json", "tokenizer.json", "*.safetensors")
"""What `load_model` reads of a checkpoint directory: the files its answers are a function of."""


@dataclass(frozen=True, eq=True)
class NativeBackend(Backend):
    """Quail's executor. Stateless, so every instance is equal: sessions share the engine it boots."""

    name: str = "native"

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if model.kind == "embedding":
            return embedding_support(model, device)
        if model.architecture not in ARCHITECTURES:
            return SupportResult.reject(
                f"architecture {model.architecture!r} is not implemented; native runs {', '.join(ARCHITECTURES)}"
            )
        if importlib.util.find_spec("torch") is None:
            return SupportResult.reject("torch is not installed: pip install torch")
        if device.kind == "cuda":
            return _cuda_support(gpu_count)
        return SupportResult.accept()

    def tokenizer(self, model: ModelSpec) -> Tokenizer:
        if model.kind == "embedding":
            return checkpoint_tokenizer(model)
        from quail_native.models.locate import model_directory
        from quail_native.models.tokenizer import load_tokenizer

        return load_tokenizer(model_directory(model))

    def model_identity(self, model: ModelSpec, device: DeviceSpec, config: EngineConfig) -> ModelIdentity | None:
        """The checkpoint's files, the precision it runs in and the device kind (kernels round differently)."""
        if model.kind == "embedding":
            return embedding_identity(model, device)
        from quail_native.models.locate import model_directory

        directory = model_directory(model)
        files = tuple(sorted({p for pattern in CHECKPOINT_FILES for p in Path(directory).glob(pattern)}))
        return ModelIdentity(files, (("precision", precision_name(config, device, model)), ("device", device.kind)))

    def start(self, context: GpuContext) -> ModelExecution:
        if context.model.kind == "embedding":
            return start_embedding(context)
        import torch

        from quail_native.execution import NativeExecution
        from quail_native.executor.arena import KVArena, KVShape
        from quail_native.executor.readout import AnswerColumns
        from quail_native.executor.state import Budget
        from quail_native.models import kernels, projection
        from quail_native.models.loading import load_model
        from quail_native.models.locate import model_directory
        from quail_native.precision import choose_precision

        device = torch.device("cuda", context.device_index) if context.device.kind == "cuda" else torch.device("cpu")
        model = context.model
        precision = choose_precision(context.config.precision, device, model.hidden, model.ffn)
        dtype = precision.dtype
        loaded = load_model(model_directory(model), dtype, device)
        tokens = answer_tokens(loaded.tokenizer)
        config = context.config
        shape = KVShape(loaded.arch.layers, loaded.arch.kv_heads, loaded.arch.head_dim, dtype)
        budget = config.kv_budget_bytes
        if budget is None:
            budget = config.chunk_tokens * DEFAULT_KV_CHUNKS * shape.bytes_per_token()
        arena = KVArena.from_budget(shape, budget, config.kv_page_tokens, device)
        notes = [f"native engine computes in {precision.reason}"]
        if device.type == "cpu":  # built here, at boot, when this machine has no build cached yet
            notes.append(f"elementwise work: {kernels.status().detail}")
            notes.append(f"projections: {projection.describe(device, dtype)}")
            notes.append(f"attention: {kernels.attention_status(dtype)}")
        return NativeExecution(loaded, AnswerColumns(tokens.true_ids, tokens.false_ids), arena,
                               Budget(config.chunk_tokens), tuple(notes))


def precision_name(config: EngineConfig, device: DeviceSpec, model: ModelSpec) -> str:
    """The precision the engine computes in ("fp32" / "bf16"): as configured, else what `auto` picks here.

    Only `auto` on a CPU that has never run the GEMM probe needs torch: planning with a precision given, or
    on a CPU whose probe is remembered, stays torch-free."""
    unmeasured = unmeasured_precision(config.precision, device.kind)
    if unmeasured is not None:
        return unmeasured[0]
    remembered = recall(record_path(model.hidden, model.ffn))
    if remembered is not None:
        return remembered.precision
    import torch

    from quail_native.precision import choose_precision

    chosen = choose_precision(config.precision, torch.device("cpu"), model.hidden, model.ffn)
    return "bf16" if chosen.dtype == torch.bfloat16 else "fp32"


def _cuda_support(gpu_count: int) -> SupportResult:
    import torch  # only for a CUDA device: listing backends on a CPU machine stays torch-free

    available = torch.cuda.device_count()
    if available < gpu_count:
        return SupportResult.reject(f"needs {gpu_count} CUDA device(s), this machine has {available}")
    return SupportResult.accept()
