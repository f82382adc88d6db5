"""The `local` compute provider: model work in the caller's own process (the default).

Its runtime state is process-wide, so an engine booted for one Session serves the next Session on
the same model without booting again.
"""

from __future__ import annotations

import threading

from quail.backends.base import BackendExecutionContext, RuntimeState
from quail.compute.base import Caller
from quail.compute.lifetime import on_release
from quail.compute.request import PhysicalRequest, PhysicalResponse
from quail.compute.rounds import execute_in_rounds, rounds_of
from quail.serving.engines import forget_kv_all, release_all, serve

RUNTIME_STATE: RuntimeState = {}
"""Every engine the local provider has booted in this process."""
ENGINES_IN_USE = threading.RLock()
"""One request at a time on this process's engines. Sessions share them — a server's planning session explaining a
blocked join (its embeddings and recall pilot) while the other runs a query, two threads of one notebook — and an
engine's KV arena and kernels serve one request at a time: the second waits."""


class LocalProvider:
    name = "local"

    def execute(self, request: PhysicalRequest, caller: Caller) -> PhysicalResponse:
        def run(part: PhysicalRequest) -> PhysicalResponse:
            return serve(BackendExecutionContext(part, caller.registry, RUNTIME_STATE, caller.progress))

        rounds = rounds_of(request)
        with ENGINES_IN_USE:
            return run(request) if rounds is None else execute_in_rounds(request, rounds, run)

    def close(self) -> None:
        release_all(RUNTIME_STATE)


def _release() -> None:
    release_all(RUNTIME_STATE)


on_release(_release)


def forget_kv_caches() -> None:
    """Every engine this process keeps (the `local` provider's) computes every prefix again on its next
    query: its KV and prefix caches are emptied, the engines stay booted. Benchmarks call it between runs."""
    forget_kv_all(RUNTIME_STATE)
