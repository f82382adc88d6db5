"""The `ray` provider's workers: the cluster joined (or started), one actor per worker, lost ones replaced.

The pool is process-wide, like the `process` provider's: workers outlive sessions, so their engines
stay warm for later queries until `quail.release_engines()` (or exit) stops them — and shuts the
cluster down when the pool started it. Placement is Ray's: each actor asks for its CPUs and GPUs and
Ray puts it on a node; the pool only checks first that the cluster could ever hold them, so a
missing resource is a refusal that names it rather than an actor waiting forever.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quail import DeviceSpec, EngineConfig, Refusal, RefusalError
from quail_ray.worker import QuailWorker

if TYPE_CHECKING:
    from ray.actor import ActorHandle
    from ray.util.queue import Queue

PLACEMENT_TIMEOUT_S = 120.0
"""How long new workers may take to be placed and started before the pool refuses."""
RELEASE_TIMEOUT_S = 30.0
"""How long a worker may take to close its engines before it is killed anyway."""
ROOM_HINT = "lower EngineConfig.workers or the resources per worker, or add nodes (`ray start --address …`)"


@dataclass(frozen=True)
class Shape:
    """What the pool's workers are: how many, and what each holds."""

    workers: int
    cpus: float
    gpus: float


@dataclass
class Worker:
    """One actor of the pool; `name` says where it runs (node and pid), for reports."""

    index: int
    actor: ActorHandle
    name: str
    alive: bool = True


def per_worker(config: EngineConfig, device: DeviceSpec) -> tuple[float, float]:
    """(CPUs, GPUs) each worker holds: a GPU per worker on a GPU device unless said otherwise."""
    gpus = config.worker_gpus if config.worker_gpus is not None else (1.0 if device.kind == "cuda" else 0.0)
    return config.worker_cpus, gpus


class WorkerPool:
    """The actors of this process, for the shape the latest query asked for."""

    def __init__(self) -> None:
        self._workers: list[Worker] = []
        self._shape: Shape | None = None
        self._job: str | None = None
        self._owned = False
        self._events: Queue | None = None
        self._starts: dict[int, int] = {}
        self._lock = threading.RLock()

    # -- the cluster --------------------------------------------------------------------------------

    def _connect(self, address: str | None) -> None:
        """Join the cluster (or start a local one); forget actors of a cluster this process left."""
        import ray

        if not ray.is_initialized():
            self._forget()
            try:
                if address is None:
                    path = os.pathsep.join(p for p in sys.path if p)
                    ray.init(include_dashboard=False, logging_level=logging.WARNING,
                             runtime_env={"env_vars": {"PYTHONPATH": path}})
                else:
                    ray.init(address=address, logging_level=logging.WARNING)
            except Exception as error:  # Ray's own reasons (no cluster at the address, no room to start one)
                where = "start a local Ray cluster" if address is None else f"reach the Ray cluster at {address!r}"
                raise RefusalError(Refusal(f"could not {where}", (f"{type(error).__name__}: {error}",),
                                           hints=("start one with `ray start --head`, then use "
                                                  "EngineConfig(compute='ray', address='auto')",))) from error
            self._owned = address is None
        job = ray.get_runtime_context().get_job_id()
        if job != self._job:
            self._forget()
            self._job = job

    def _forget(self) -> None:
        """Drop handles to a cluster this process is no longer connected to (its actors went with it)."""
        self._workers, self._shape, self._events, self._owned = [], None, None, False

    def _shape_for(self, config: EngineConfig, device: DeviceSpec) -> Shape:
        import ray

        cpus, gpus = per_worker(config, device)
        total = ray.cluster_resources()
        held = {"CPU": total.get("CPU", 0.0), "GPU": total.get("GPU", 0.0)}
        workers = config.workers
        if workers is None:
            workers = int(held["GPU"] // gpus) if gpus > 0 else int(held["CPU"] // cpus)
        for resource, each in (("CPU", cpus), ("GPU", gpus)):
            if each > 0 and max(workers, 1) * each > held[resource]:
                raise RefusalError(Refusal(
                    f"the Ray cluster has no room for {max(workers, 1)} worker(s) of {each:g} {resource}(s) each",
                    needed=max(workers, 1) * each, available=held[resource], unit=f"{resource}s",
                    hints=(ROOM_HINT,)))
        return Shape(workers, cpus, gpus)

    # -- workers ------------------------------------------------------------------------------------

    def workers(self, config: EngineConfig, device: DeviceSpec) -> list[Worker]:
        """The live workers for this config, started (or restarted in a new shape) as needed."""
        with self._lock:
            self._connect(config.address)
            shape = self._shape_for(config, device)
            if shape != self._shape:
                self._stop_workers()
                self._shape = shape
            missing = [i for i in range(shape.workers) if i >= len(self._workers) or not self._workers[i].alive]
            started = self._start(missing, shape)
            for worker in started:
                if worker.index < len(self._workers):
                    self._workers[worker.index] = worker
                else:
                    self._workers.append(worker)
            return [w for w in self._workers if w.alive]

    def replacement(self, index: int) -> Worker:
        """A new worker in place of a lost one (when no live worker is left to re-run a shard)."""
        with self._lock:
            assert self._shape is not None, "a replacement needs a pool that has started"
            [worker] = self._start([index], self._shape)
            self._workers[index] = worker
            return worker

    def _start(self, indices: list[int], shape: Shape) -> list[Worker]:
        import ray

        if not indices:
            return []
        remote = ray.remote(QuailWorker)
        actors = []
        for index in indices:
            self._starts[index] = self._starts.get(index, 0) + 1
            label = f"ray worker {index}" + (f", start {self._starts[index]}" if self._starts[index] > 1 else "")
            actors.append((index, remote.options(num_cpus=shape.cpus, num_gpus=shape.gpus,
                                                 max_restarts=0).remote(label)))
        try:
            names = ray.get([actor.ready.remote() for _, actor in actors], timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for _, actor in actors:
                ray.kill(actor)
            available = ray.available_resources()
            raise RefusalError(Refusal(
                f"the Ray cluster placed no room for {len(actors)} worker(s) of {shape.cpus:g} CPU(s) and "
                f"{shape.gpus:g} GPU(s) within {PLACEMENT_TIMEOUT_S:g} s",
                (f"available now: {available.get('CPU', 0):g} CPU(s), {available.get('GPU', 0):g} GPU(s)",),
                hints=(ROOM_HINT,))) from None
        except ray.exceptions.RayActorError as error:
            for _, actor in actors:
                ray.kill(actor)
            raise RefusalError(Refusal("a Ray worker could not start", (str(error).splitlines()[0],),
                                       hints=("install quail-ray and the backend's package on every node",))) from None
        return [Worker(index, actor, name) for (index, actor), name in zip(actors, names, strict=True)]

    def lost(self, worker: Worker) -> None:
        """A worker that died: never used again (its actor is killed in case it only hangs)."""
        import ray

        with self._lock:
            worker.alive = False
            ray.kill(worker.actor, no_restart=True)

    def live(self) -> list[Worker]:
        with self._lock:
            return [w for w in self._workers if w.alive]

    def planned(self) -> int | None:
        """The number of workers a query gets now, when the pool has started."""
        with self._lock:
            return self._shape.workers if self._shape is not None else None

    def events(self) -> Queue:
        """The queue workers report progress to (a zero-CPU actor, so it never takes a worker's room)."""
        from ray.util.queue import Queue

        with self._lock:
            if self._events is None:
                self._events = Queue(actor_options={"num_cpus": 0})
            return self._events

    # -- release ------------------------------------------------------------------------------------

    def _stop_workers(self) -> None:
        import ray

        workers, self._workers = self._workers, []
        closing = [w.actor.release.remote() for w in workers if w.alive]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=RELEASE_TIMEOUT_S)
        for worker in workers:
            ray.kill(worker.actor, no_restart=True)

    def close(self) -> None:
        """Stop every worker (their engines closed first) and the progress queue; shut down a cluster
        this pool started. Nothing is left on the cluster."""
        if sys.modules.get("ray") is None:
            return  # this process never used Ray (or it cannot import): nothing to stop, no reason to import it
        import ray

        with self._lock:
            if not ray.is_initialized():
                self._forget()
                return
            self._stop_workers()
            if self._events is not None:
                self._events.shutdown(force=True)
            if self._owned:
                ray.shutdown()
            self._forget()
            self._job = None
