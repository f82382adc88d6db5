"""The compute-provider role: where a query's model work runs.

The coordinator (the user's Session) plans, encodes the model part of the plan as a
`PhysicalRequest` (plans through codecs, documents as token columns, specs as frozen dataclasses)
and hands it to the provider chosen by `EngineConfig.compute`. On the far side the provider calls
the backend's `execute_request` and returns the Arrow answer tables with metrics; the coordinator
runs the relational part. Providers are registered through the plugin hooks, like backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from quail.backends.base import BackendLookup
from quail.compute.request import PhysicalRequest, PhysicalResponse
from quail.config import EngineConfig
from quail.progress import ProgressListener


@dataclass(frozen=True)
class Caller:
    """What stays on the caller's side: live objects a provider may use in-process, never send.

    The `local` provider finds the backend in the caller's registry (so backends registered in
    code run too); providers with workers elsewhere use their workers' own registries.
    """

    registry: BackendLookup
    progress: ProgressListener | None = None


@runtime_checkable
class ComputeProvider(Protocol):
    """Runs the model part of queries: in-process, in a worker process, on a cluster.

    Workers and the engines booted in them belong to the process, not to a session: they serve
    every later query and are released by `close()` (`quail.release_engines()` closes every
    provider's, and it runs at interpreter exit).
    """

    name: str

    def execute(self, request: PhysicalRequest, caller: Caller) -> PhysicalResponse: ...

    def close(self) -> None: ...


@runtime_checkable
class ShardingProvider(Protocol):
    """A provider that splits model work over workers by `quail.planner.partition`: explain shows how."""

    def planned_workers(self, config: EngineConfig) -> int | None:
        """Workers a query would be split over; None while that depends on a cluster not reached yet."""
        ...
