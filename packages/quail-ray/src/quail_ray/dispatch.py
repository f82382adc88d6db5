"""Running one phase's shards on the pool: each on its worker, all side by side; a shard whose worker
dies runs again on another; once a LIMIT has its rows, the rest are cancelled.

Everything here is Ray's machinery used as it comes — actor calls, `ray.wait`, `ray.cancel`, a Ray
queue for progress; what each shard holds was decided by the planner (`quail.planner.partition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from quail.extend import (
    Answers,
    Partition,
    Phase,
    PhysicalRequest,
    PhysicalResponse,
    PortRef,
    Shard,
    ShardMetrics,
    ShardProgress,
    WorkerLostError,
    decode_error,
    decode_response,
    limit_reached,
    merge_answers,
    shard_metrics,
    shard_request,
)
from quail_ray.pool import Worker, WorkerPool
from quail_ray.transport import TokenShipment, from_ray, request_frames

if TYPE_CHECKING:
    from ray import ObjectRef

    from quail_ray.transport import RayFrames

MAX_RETRIES = 3
"""Times one shard is re-run after losing its worker before the query fails."""
POLL_S = 0.1
"""How often the coordinator looks at progress while shards run."""


@dataclass(frozen=True)
class PhaseOutcome:
    """What a phase returned: its merged answers, each shard's response and metrics, and — when a LIMIT
    stopped it early — the rows of its alias that the answers cover."""

    answers: Answers
    responses: tuple[PhysicalResponse, ...]
    shards: tuple[ShardMetrics, ...]
    covered: pa.Table | None = None


@dataclass
class _Running:
    shard: Shard
    worker: Worker
    retries: int


@dataclass
class PhaseRun:
    """One phase of one query on the pool."""

    pool: WorkerPool
    request: PhysicalRequest
    partition: Partition
    phase: Phase
    earlier: Mapping[PortRef, pa.Table]
    shipment: TokenShipment
    progress: ShardProgress
    query: str
    pending: dict[ObjectRef[RayFrames], _Running] = field(default_factory=dict)
    done: dict[int, tuple[_Running, PhysicalResponse]] = field(default_factory=dict)

    def run(self) -> PhaseOutcome:
        workers = {w.index: w for w in self.pool.live()}
        for shard in self.phase.shards:
            self._submit(shard, workers.get(shard.worker) or self._least_loaded(), 0)
        try:
            while self.pending:
                covered = self._step()
                if covered is not None:
                    return self._outcome(covered, cancelled=self._cancel_pending())
        except BaseException:  # an error, or Ctrl-C: nothing of this query keeps running
            self._cancel_pending()
            raise
        self._forward_progress()  # what the last shards reported before they answered
        return self._outcome(None, cancelled=[])

    def _step(self) -> pa.Table | None:
        """Wait a little, pass progress on, settle what finished; the covered rows when a LIMIT is met."""
        import ray

        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=POLL_S)
        self._forward_progress()
        finished = False
        for ref in ready:
            finished = self._settle(ref) or finished
        if not finished or self.partition.limit is None:
            return None
        answers = {**self.earlier, **merge_answers(self.request.graph, self.phase, self._answered())}
        return limit_reached(self.request, self.partition, self.phase, answers, self.done)

    def _submit(self, shard: Shard, worker: Worker, retries: int) -> None:
        frames = request_frames(shard_request(self.request, self.phase, shard, self.earlier))
        beside = self.shipment.beside(self.phase, shard)
        ref = worker.actor.run.remote(frames, beside, self.pool.events(), (self.query, shard.index))
        self.pending[ref] = _Running(shard, worker, retries)

    def _settle(self, ref: ObjectRef[RayFrames]) -> bool:
        """Take a finished shard's answer (True), or re-run it elsewhere when its worker died (False)."""
        import ray

        running = self.pending.pop(ref)
        try:
            frames = ray.get(ref)
        except ray.exceptions.RayActorError:
            self.pool.lost(running.worker)
            self._rerun(running)
            return False
        message = from_ray(frames)
        if message.kind == "error":
            raise decode_error(message, running.worker.name)
        self.done[running.shard.index] = (running, decode_response(message))
        return True

    def _rerun(self, running: _Running) -> None:
        if running.retries >= MAX_RETRIES:
            raise WorkerLostError(f"shard {running.shard.index} of phase {self.phase.index} lost its worker "
                                  f"{running.retries + 1} times (last {running.worker.name}); the query stopped, "
                                  "and the next one starts new workers")
        live = self.pool.live()
        target = self._least_loaded() if live else self.pool.replacement(running.worker.index)
        self._submit(running.shard, target, running.retries + 1)

    def _least_loaded(self) -> Worker:
        load = {w.index: 0 for w in self.pool.live()}
        for running in self.pending.values():
            if running.worker.index in load:
                load[running.worker.index] += 1
        live = {w.index: w for w in self.pool.live()}
        return live[min(load, key=lambda index: (load[index], index))]

    def _forward_progress(self) -> None:
        events = self.pool.events()
        count = events.qsize()
        for query, shard, node, done, total in events.get_nowait_batch(count) if count else ():
            if query == self.query:
                self.progress.report(node, shard, done, total, len(self.phase.shards))

    def _cancel_pending(self) -> list[_Running]:
        import ray

        cancelled = list(self.pending.values())
        for ref in self.pending:
            ray.cancel(ref)
        self.pending.clear()
        return cancelled

    def _answered(self) -> list[tuple[Shard, PhysicalResponse]]:
        return [(running.shard, response) for running, response in self.done.values()]

    def _outcome(self, covered: pa.Table | None, cancelled: list[_Running]) -> PhaseOutcome:
        self.progress.finish(self.phase.nodes)
        answered = sorted(self.done.values(), key=lambda item: item[0].shard.index)
        metrics = [self._metrics(running, response) for running, response in answered]
        metrics += [self._metrics(running, None) for running in cancelled]
        return PhaseOutcome(merge_answers(self.request.graph, self.phase, self._answered()),
                            tuple(response for _, response in answered),
                            tuple(sorted(metrics, key=lambda m: m.shard)), covered)

    def _metrics(self, running: _Running, response: PhysicalResponse | None) -> ShardMetrics:
        return shard_metrics(self.phase, running.shard, running.worker.name, response, running.retries)
