"""The `native` backend: Quail's own executor behind the backend contract."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

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

ARCHITECTURES = ("qwen3", "gemma3")

NOT_BUILT = Refusal(
    "the native backend cannot plan or execute queries yet",
    ("its executor (models, packed prefill, KV reuse) is not part of this release",),
)


class NativeBackend:
    name = "native"

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if model.architecture not in ARCHITECTURES:
            return SupportResult.reject(
                f"architecture {model.architecture!r} is not implemented; native runs {', '.join(ARCHITECTURES)}"
            )
        if importlib.util.find_spec("torch") is None:
            return SupportResult.reject("torch is not installed: pip install torch")
        if device.kind == "cuda":
            return _cuda_support(gpu_count)
        return SupportResult.accept()

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        return NOT_BUILT

    def start(self, context: GpuContext) -> ModelExecution:
        raise RefusalError(NOT_BUILT)

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        raise RefusalError(NOT_BUILT)


def _cuda_support(gpu_count: int) -> SupportResult:
    import torch  # only for a CUDA device: listing backends on a CPU machine stays torch-free

    available = torch.cuda.device_count()
    if available < gpu_count:
        return SupportResult.reject(f"needs {gpu_count} CUDA device(s), this machine has {available}")
    return SupportResult.accept()
