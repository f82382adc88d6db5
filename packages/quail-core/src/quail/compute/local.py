"""The `local` compute provider: model work in the caller's own process (the default).

Its runtime state is process-wide, so an engine booted for one Session serves the next Session on
the same model without booting again.
"""

from __future__ import annotations

from quail.backends.base import BackendExecutionContext, PhysicalRequest, PhysicalResponse, RuntimeState
from quail.backends.serving import release_all
from quail.compute.base import Caller
from quail.compute.lifetime import on_release

RUNTIME_STATE: RuntimeState = {}
"""Every engine the local provider has booted in this process."""


class LocalProvider:
    name = "local"

    def execute(self, request: PhysicalRequest, caller: Caller) -> PhysicalResponse:
        backend = caller.registry.backend(request.backend)
        context = BackendExecutionContext(request, caller.registry, RUNTIME_STATE, caller.progress)
        return backend.execute_request(context)

    def close(self) -> None:
        release_all(RUNTIME_STATE)


def _release() -> None:
    release_all(RUNTIME_STATE)


on_release(_release)
