"""A backend that accepts CPU devices and refuses to plan: enough to prove discovery."""

from __future__ import annotations

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
from quail.testing import KeywordBackend

NO_PLANS = Refusal("the example backend runs no queries", ("it exists to test plugin discovery",))


class ExampleBackend:
    name = "example"

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if device.kind != "cpu":
            return SupportResult.reject("the example backend only runs on the CPU")
        return SupportResult.accept()

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        return NO_PLANS

    def start(self, context: GpuContext) -> ModelExecution:
        raise RefusalError(NO_PLANS)

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        raise RefusalError(NO_PLANS)


class ExampleKeywordBackend(KeywordBackend):
    """quail.testing's deterministic keyword backend, under a name of this plugin's own."""

    name = "example-keyword"
