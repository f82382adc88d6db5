"""The `sglang` backend behind the backend contract."""

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

NOT_BUILT = Refusal(
    "the sglang backend cannot plan or execute queries yet",
    ("its request planning and engine adapter are not part of this release",),
)


class SGLangBackend:
    name = "sglang"

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if model.architecture not in ARCHITECTURES:
            return SupportResult.reject(f"architecture {model.architecture!r} is not wired to SGLang here")
        if device.kind != "cuda":
            return SupportResult.reject("SGLang needs one CUDA GPU; its PyPI build does not run on CPU")
        if gpu_count != 1:
            return SupportResult.reject(f"runs on exactly one GPU; {gpu_count} were asked for")
        try:
            version("sglang")
        except PackageNotFoundError:
            return SupportResult.reject("SGLang is not installed: pip install 'quail-sglang[engine]'")
        return SupportResult.accept()

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        return NOT_BUILT

    def start(self, context: GpuContext) -> ModelExecution:
        raise RefusalError(NOT_BUILT)

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        raise RefusalError(NOT_BUILT)
