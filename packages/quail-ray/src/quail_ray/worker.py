"""The Ray actor behind one worker: a device's engines, kept warm across queries.

Like a `process` worker, it builds its own registry from the installed plugins (plus a request's
`worker_setup` hook, the counterpart of Ray's `worker_process_setup_hook`) and answers requests
through the backend's `execute_request`, keeping every engine it boots in its runtime state. Every
answer and every error goes back as wire frames; progress goes to the coordinator's event queue, and
a progress report is also where a cancelled shard stops (Ray cancels a running actor task only by
flagging it).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

import pyarrow as pa

from quail import ExtensionRegistry, QuailError, Refusal, RefusalError
from quail.extend import (
    BackendExecutionContext,
    PhysicalNode,
    PhysicalResponse,
    RuntimeState,
    decode_request,
    encode_error,
    encode_response,
    release_all,
    serve,
)
from quail_ray.transport import RayFrames, from_ray, to_ray

if TYPE_CHECKING:
    from ray.util.queue import Queue

    from quail_ray.transport import Beside

Ticket = tuple[str, int]
"""(query id, shard index): whose progress an event is."""


class ShardCancelled(QuailError):
    """The coordinator cancelled this shard (a LIMIT already had its rows); raised at a progress report."""


class QuailWorker:
    """One worker of the `ray` provider (wrapped by `ray.remote` when the pool starts it)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.state: RuntimeState = {}
        self.registries: dict[str | None, ExtensionRegistry] = {}

    def describe(self) -> str:
        import ray

        return f"{self.label} (node {ray.util.get_node_ip_address()}, pid {os.getpid()})"

    def ready(self) -> str:
        """Answered once the actor is placed and started: the pool waits on it."""
        return self.describe()

    def registry(self, setup: str | None) -> ExtensionRegistry:
        """The installed plugins plus the setup hook, built on first use (its failure is that request's)."""
        if setup not in self.registries:
            registry = ExtensionRegistry.with_built_ins()
            if setup is not None:
                module, function = setup.split(":")
                try:
                    getattr(importlib.import_module(module), function)(registry)
                except Exception as error:  # the hook is the user's code: say where it failed, and how to fix it
                    raise RefusalError(Refusal(
                        f"worker setup hook {setup!r} failed on {self.describe()}",
                        (f"{type(error).__name__}: {error}",),
                        hints=("make the module importable on every node (install it, or ship it with ray.init's "
                               "runtime_env)",))) from error
            self.registries[setup] = registry
        return self.registries[setup]

    def run(self, frames: RayFrames, beside: Beside, events: Queue | None, ticket: Ticket) -> RayFrames:
        """Answer one shard's request: the response's frames, or the error's."""
        try:
            return to_ray(encode_response(self._answer(frames, beside, events, ticket)))
        except Exception as error:  # every failure goes back to the coordinator as data
            return to_ray(encode_error(error))

    def _answer(self, frames: RayFrames, beside: Beside, events: Queue | None, ticket: Ticket) -> PhysicalResponse:
        import ray

        tables: list[pa.Table] = ray.get(list(beside.values()))  # zero-copy reads of the object store
        columns = {alias: table.column("tokens") for alias, table in zip(beside, tables, strict=True)}
        request = decode_request(from_ray(frames), columns)
        registry = self.registry(request.config.worker_setup)
        task = ray.get_runtime_context()

        def progress(node: PhysicalNode, done: int, total: int) -> None:
            if task.is_canceled():
                raise ShardCancelled(f"shard {ticket[1]} was cancelled at {node.id}")
            if events is not None:
                events.put_nowait((ticket[0], ticket[1], node.id, done, total))

        return serve(BackendExecutionContext(request, registry, self.state, progress))

    def release(self) -> int:
        """Close every engine this worker keeps; how many there were."""
        return release_all(self.state)
