"""The shared `execute_request`: where every backend's model work runs, on the far side of a compute provider.

A backend's `execute_request(context)` may simply return `execute_request(self, context)` from here:
the backend is booted with `start()` once per (backend, model, device, engine settings) and the
`ModelExecution` is kept in the worker's `runtime_state`, so an engine outlives the query and the
session that booted it; the requested part of the graph then runs through the generic runner.

Engines are kept `engines_per_device` at a time per device (least recently used closed first), and
an engine whose query failed is closed rather than trusted with the next one.

Model nodes reach the engine through the answer store (`quail.cache`): what is stored is read,
identical prompts are asked once, the rest is computed and stored as it arrives — for every backend
that runs here, and without booting an engine when nothing is left to compute.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable
from dataclasses import dataclass

from quail.backends.base import (
    BackendExecutionContext,
    DescribesEngine,
    ForgetsKV,
    ModelBackend,
    ModelExecution,
    RuntimeState,
)
from quail.cache.access import StoredAnswerAccess
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.request import BootKind, ExecutionMetrics, PhysicalResponse, model_token_totals
from quail.config import EngineConfig
from quail.serving.runner import RunInputs, Runner
from quail.serving.stored import CachedExecution

_USES = itertools.count()


@dataclass(frozen=True)
class EngineKey:
    """What a booted engine is for. Backends that compare equal share engines (a backend's `__eq__`)."""

    backend: Hashable
    model: ModelSpec
    device: DeviceSpec
    device_index: int
    settings: EngineConfig

    @property
    def device_slot(self) -> tuple[str, int, str]:
        """Engines of one device and model kind: an embedding engine (a small encoder) is kept beside the generative
        one rather than in its place."""
        return (self.device.name, self.device_index, self.model.kind)


@dataclass
class StartedEngine:
    """A booted engine in a runtime state, and when it was last used."""

    execution: ModelExecution
    boot_s: float
    last_used: int


@dataclass
class _Boot:
    """How the engine of one request was obtained (None until a model node needed it)."""

    execution: ModelExecution | None = None
    seconds: float | None = None
    kind: BootKind | None = None

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self.execution.notes) if isinstance(self.execution, DescribesEngine) else ()


def serve(context: BackendExecutionContext) -> PhysicalResponse:
    """The far side of every compute provider: the backend the request names, found in the context's registry
    (the worker's own, or the caller's for the `local` provider), answers it."""
    return context.registry.backend(context.request.backend).execute_request(context)


def execute_request(backend: ModelBackend, context: BackendExecutionContext) -> PhysicalResponse:
    """Run the request's outputs on the backend's engine kept in `context.runtime_state` (booted on first need)."""
    started = time.perf_counter()
    key = engine_key(backend, context)
    boot = _Boot()

    def start() -> ModelExecution:
        boot.execution, boot.seconds, boot.kind = started_execution(backend, key, context)
        return boot.execution

    access = StoredAnswerAccess.open(backend, context.model, context.device, context.config)
    tokens = {alias: table.tokens for alias, table in context.tables.items() if table.tokens is not None}
    skipped = {alias: table.left_out for alias, table in context.tables.items() if table.left_out is not None}
    runner = Runner(context.graph, RunInputs(context.tables, tokens, skipped),
                    lambda: CachedExecution(start, access, context.config.chunk_tokens, backend.name),
                    backend=backend.name,
                    progress=context.progress)
    try:
        output = runner.run(context.outputs, known=context.known)
    except BaseException:
        release(context.runtime_state, key)  # a failed query may leave the engine inconsistent
        raise
    finally:
        access.close()
    fresh, cached = model_token_totals(context.graph, output.node_metrics)
    metrics = ExecutionMetrics(time.perf_counter() - started, fresh, cached, boot.seconds, boot.kind,
                               nodes=output.node_metrics, notes=boot.notes)
    return PhysicalResponse(output.tables, metrics)


def engine_key(backend: ModelBackend, context: BackendExecutionContext, device_index: int = 0) -> EngineKey:
    return EngineKey(backend, context.model, context.device, device_index, context.config.engine_settings())


def started_execution(backend: ModelBackend, key: EngineKey,
                      context: BackendExecutionContext) -> tuple[ModelExecution, float | None, BootKind]:
    """(the engine, boot seconds or None when it was already running, cold or warm)."""
    state = context.runtime_state
    found = state.get(key)
    if isinstance(found, StartedEngine):
        found.last_used = next(_USES)
        return found.execution, None, "warm"
    make_room(state, key.device_slot, context.config.engines_per_device - 1)
    began = time.perf_counter()
    execution = backend.start(context.gpu_context(key.device_index))
    boot_s = time.perf_counter() - began
    state[key] = StartedEngine(execution, boot_s, next(_USES))
    return execution, boot_s, "cold"


def make_room(state: RuntimeState, slot: tuple[str, int, str], keep: int) -> None:
    """Close the least recently used engines on a device until at most `keep` remain there."""
    engines = sorted(((k, v) for k, v in state.items() if isinstance(k, EngineKey) and isinstance(v, StartedEngine)
                      and k.device_slot == slot), key=lambda item: item[1].last_used)
    for key, _ in engines[:max(0, len(engines) - keep)]:
        release(state, key)


def release(state: RuntimeState, key: EngineKey) -> None:
    found = state.pop(key, None)
    if isinstance(found, StartedEngine):
        found.execution.close()


def forget_kv_all(state: RuntimeState) -> None:
    """Every kept engine that can drops the KV it keeps between queries; the engines stay booted."""
    for value in list(state.values()):
        if isinstance(value, StartedEngine) and isinstance(value.execution, ForgetsKV):
            value.execution.forget_kv()


def release_all(state: RuntimeState) -> int:
    """Close every engine kept in `state`; how many there were. Errors of one close never skip the others."""
    keys = [k for k, v in state.items() if isinstance(v, StartedEngine)]
    failures: list[BaseException] = []
    for key in keys:
        try:
            release(state, key)  # type: ignore[arg-type]
        except Exception as error:  # one engine failing to close must not keep the others open
            failures.append(error)
    if failures:
        raise failures[0]
    return len(keys)
