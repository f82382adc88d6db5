"""The `ray` compute provider: a query's model work split over the actors of a Ray cluster.

The coordinator (the caller's process) asks the planner how to split the work
(`quail.planner.partition`), runs each phase's shards on the pool's workers — each booting its engine
once and keeping it for later queries — merges their Arrow answers, and runs the relational part
over whole tables, so the rows are the unsplit plan's. Ray owns the cluster: placement, transport,
object store, failure detection; this provider only says what runs where.
"""

from __future__ import annotations

import os
import time
import uuid
from types import ModuleType

from quail import EngineConfig, Refusal, RefusalError
from quail.extend import (
    Answers,
    Caller,
    PhysicalRequest,
    PhysicalResponse,
    ShardMetrics,
    finish,
    merge_metrics,
    on_release,
    progress_of,
    request_partition,
    scan_port,
)
from quail_ray.dispatch import PhaseRun
from quail_ray.pool import WorkerPool
from quail_ray.transport import TokenShipment

POOL = WorkerPool()
"""Every Ray worker this process started: shared by all sessions, released with `quail.release_engines()`."""
on_release(POOL.close)


class RayProvider:
    name = "ray"

    def planned_workers(self, config: EngineConfig) -> int | None:
        """`EngineConfig.workers`, else the pool's size once it has started (None before)."""
        return config.workers if config.workers is not None else POOL.planned()

    def execute(self, request: PhysicalRequest, caller: Caller) -> PhysicalResponse:
        ray = _ray()
        started = time.perf_counter()
        workers = POOL.workers(request.config, request.device)
        partition = request_partition(request, len(workers))
        shipment = TokenShipment(request, ray.put)
        progress = progress_of(request, caller)
        query = uuid.uuid4().hex
        answers: Answers = {}
        responses: list[PhysicalResponse] = []
        shards: list[ShardMetrics] = []
        restrict = None
        for phase in partition.phases:
            outcome = PhaseRun(POOL, request, partition, phase, answers, shipment, progress, query).run()
            answers.update(outcome.answers)
            responses.extend(outcome.responses)
            shards.extend(outcome.shards)
            if outcome.covered is not None and phase.alias is not None:
                restrict = {scan_port(request.graph, phase.alias): outcome.covered}
        finished = finish(request, answers, restrict)
        metrics = merge_metrics(request.graph, responses, shards, finished.node_metrics,
                                time.perf_counter() - started)
        return PhysicalResponse(finished.tables, metrics)

    def close(self) -> None:
        POOL.close()


def _ray() -> ModuleType:
    """The ray module, or a refusal that says how to get it (before any worker or model work starts).

    Ray's driver would install absl's failure-signal handler, which answers SIGTERM with a stack dump and an abort
    (exit 134) after the command's own clean shutdown; Quail's command line handles SIGTERM itself (exit 143,
    nothing left behind). Ray reads the variable when it is first imported, which is here; a process that wants
    Ray's handler sets it to 0."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError as error:
        raise RefusalError(Refusal("compute provider 'ray' cannot run here: the ray package does not import",
                                   (f"{type(error).__name__}: {error}",),
                                   hints=("install it (pip install 'ray[default]'), or choose --compute local "
                                          "or process",))) from None
    return ray
