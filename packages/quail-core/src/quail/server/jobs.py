"""The queries a server holds: each a job with a state, live progress and its outcome, run one at a time on one
warm session, taken fairly from the clients that submitted them.

One thread runs the jobs, in turn per client (round robin: a client that submits ten queries does not keep
another client's one waiting behind all ten); inside a client, in the order submitted. Jobs change on that
thread and are read on the server's event loop: every change happens under the job's lock and bumps its
`version`, so a watcher sends a snapshot whenever the version moved.

Cancelling a queued job takes it off its queue. Cancelling the running one asks it to stop where it can:
model work stops at the backend's next progress report (the query unwinds as on Ctrl-C — `Cancelled` — so
what was answered before stays in the answer store and the interrupted engine is closed, not trusted again),
and a DuckDB statement is interrupted at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Literal

from quail.errors import CompileError, ComputeError, QuailError, RefusalError, WorkerLostError
from quail.frontend.sql import Dialect
from quail.interrupts import Cancelled
from quail.physical.nodes import PhysicalNode
from quail.presentation import shortened
from quail.runtime.results import QueryResult
from quail.session import Session

LOG = logging.getLogger("quail.server")

JobState = Literal["queued", "running", "finished", "failed", "cancelled"]
DONE: frozenset[JobState] = frozenset({"finished", "failed", "cancelled"})
KEPT_JOBS = 200
"""Finished jobs kept for their clients to read (the oldest finished ones go first)."""
KEPT_RESULTS = 4
"""Finished jobs' rows are kept up to this many times `max_result_bytes` in all (the oldest go first)."""
PROGRESS_DESCRIPTION = 80
MAX_QUEUED = 1000
MAX_QUEUED_PER_CLIENT = 100
"""Queries waiting, in all and per client: one more is refused (429) rather than held without bound."""


@dataclass(frozen=True)
class ErrorBody:
    """An error as the wire carries it: its kind (the exception's class), the message, and the HTTP status.

    A CompileError keeps its position (`detail` is its message without it); a RefusalError its refusal's parts.
    """

    kind: str
    message: str
    status: int
    detail: str | None = None
    line: int | None = None
    column: int | None = None
    refusal: dict[str, object] | None = None

    def as_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"kind": self.kind, "message": self.message, "status": self.status}
        for name in ("detail", "line", "column", "refusal"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


def error_body(error: BaseException) -> ErrorBody:
    """What a client is told of `error`: a user's mistake in full (4xx), an internal fault by its kind only (5xx —
    the traceback goes to the server's log)."""
    if isinstance(error, CompileError):
        return ErrorBody("CompileError", str(error), 400, error.detail, error.line, error.column)
    if isinstance(error, RefusalError):
        refusal = error.refusal
        parts = {"constraint": refusal.constraint, "reasons": list(refusal.reasons), "needed": refusal.needed,
                 "available": refusal.available, "unit": refusal.unit, "hints": list(refusal.hints)}
        return ErrorBody("RefusalError", str(error), 422, refusal=parts)
    if isinstance(error, ResultTooLarge):
        return ErrorBody("ResultTooLarge", str(error), 413)
    if isinstance(error, QueueFull):
        return ErrorBody("QueueFull", str(error), 429)
    if isinstance(error, ComputeError):  # the server's workers failed, not the request: 5xx, and what happened
        return ErrorBody(type(error).__name__, str(error), 503 if isinstance(error, WorkerLostError) else 500)
    if isinstance(error, QuailError):
        return ErrorBody(_public_kind(error), str(error), 400)
    return ErrorBody("InternalError", f"internal error ({type(error).__name__}); the server's log has the traceback",
                     500)


def _public_kind(error: QuailError) -> str:
    """The class a client knows: Quail's own error classes by name, anything else (a plugin's) as QuailError."""
    name = type(error).__name__
    return name if type(error).__module__ == "quail.errors" else "QuailError"


class ResultTooLarge(QuailError):
    """A finished query whose rows are more than the server sends (`--max-result-bytes`)."""


class QueueFull(QuailError):
    """More queries waiting than the server holds (`MAX_QUEUED`, `MAX_QUEUED_PER_CLIENT`)."""


@dataclass
class NodeProgress:
    node: str
    description: str
    done: int
    total: int


@dataclass
class QueryJob:
    """One submitted statement and what became of it. Change it only through `Scheduler` (under `lock`)."""

    sql: str
    dialect: Dialect
    client: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    state: JobState = "queued"
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    progress: dict[str, NodeProgress] = field(default_factory=dict)
    result: QueryResult | None = None
    error: ErrorBody | None = None
    cancel_requested: bool = False
    version: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def done(self) -> bool:
        return self.state in DONE

    def snapshot(self) -> dict[str, object]:
        """The job as the API shows it (a copy, taken under the lock)."""
        with self.lock:
            body: dict[str, object] = {
                "id": self.id, "state": self.state, "sql": self.sql, "dialect": self.dialect,
                "submitted_at": self.submitted_at, "started_at": self.started_at, "finished_at": self.finished_at,
                "version": self.version, "cancel_requested": self.cancel_requested,
                "progress": [vars(p).copy() for p in self.progress.values()],
            }
            if self.error is not None:
                body["error"] = self.error.as_dict()
            if self.result is not None:
                table = self.result.collect()
                body["rows"] = table.num_rows
                body["columns"] = [{"name": f.name, "type": str(f.type)} for f in table.schema]
                body["report"] = self.result.report
                body["explain"] = self.result.explain()
                body["answers"] = sorted(self.result.answer_tables)
            return body

    def _change(self, **values: object) -> None:
        with self.lock:
            for name, value in values.items():
                setattr(self, name, value)
            self.version += 1

    def _finish(self, result: QueryResult) -> None:
        """Finished with `result`; every bar ends full (a node answered from the store reports its start, not its
        end)."""
        with self.lock:
            for entry in self.progress.values():
                entry.done = entry.total
            self.state, self.result, self.finished_at = "finished", result, time.time()
            self.version += 1

    def _progressed(self, node: PhysicalNode, done: int, total: int) -> None:
        with self.lock:
            entry = self.progress.get(node.id)
            if entry is None:
                entry = self.progress[node.id] = NodeProgress(node.id, shortened(node.describe(),
                                                                                 PROGRESS_DESCRIPTION), done, total)
            entry.done, entry.total = done, total
            self.version += 1


class Scheduler:
    """Runs jobs on one session, one at a time, fairly between clients; keeps the recent ones to be read."""

    def __init__(self, session: Session, *, max_result_bytes: int) -> None:
        self.session = session
        self.max_result_bytes = max_result_bytes
        self._jobs: OrderedDict[str, QueryJob] = OrderedDict()
        self._queues: OrderedDict[str, deque[QueryJob]] = OrderedDict()
        self._running: QueryJob | None = None
        self._condition = threading.Condition()
        self._stopping = False
        self._started_runs = 0
        session.registry.register_progress_listener(self._progress)
        self._thread = threading.Thread(target=self._loop, name="quail-serve-runner", daemon=True)
        self._thread.start()

    # -- what the API calls ----------------------------------------------------------------------

    def submit(self, job: QueryJob) -> QueryJob:
        with self._condition:
            if self._stopping:
                raise QuailError("the server is shutting down; no new query is taken")
            waiting = sum(len(queue) for queue in self._queues.values())
            mine = len(self._queues.get(job.client, ()))
            if waiting >= MAX_QUEUED or mine >= MAX_QUEUED_PER_CLIENT:
                raise QueueFull(f"{waiting:,} queries wait on this server, {mine:,} of them this client's (at most "
                                f"{MAX_QUEUED:,} and {MAX_QUEUED_PER_CLIENT:,}): submit again once some have run")
            self._jobs[job.id] = job
            self._queues.setdefault(job.client, deque()).append(job)
            self._forget_old()
            self._condition.notify_all()
        return job

    def job(self, job_id: str) -> QueryJob | None:
        with self._condition:
            return self._jobs.get(job_id)

    def jobs(self) -> list[QueryJob]:
        with self._condition:
            return list(self._jobs.values())

    def position(self, job: QueryJob) -> int | None:
        """How many queued jobs run before this one (None when it is not queued)."""
        with self._condition:
            order = self._queued_order()
            return order.index(job) if job in order else None

    def cancel(self, job: QueryJob) -> None:
        """Stop `job`: off its queue when queued, asked to stop when running; nothing when already done."""
        with self._condition:
            if job.done:
                return
            queue = self._queues.get(job.client)
            if queue is not None and job in queue:
                queue.remove(job)
                if not queue:
                    del self._queues[job.client]
                job._change(state="cancelled", cancel_requested=True, finished_at=time.time())
                return
            job._change(cancel_requested=True)
            if self._running is job:
                self.session.database.interrupt()

    def close(self, wait_s: float) -> bool:
        """`stop`, then wait up to `wait_s` for the runner to finish; whether it did."""
        self.stop()
        self._thread.join(wait_s)
        if self._progress in self.session.registry.progress_listeners:
            self.session.registry.unregister_progress_listener(self._progress)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Take no more jobs; cancel the queued ones and the running one. Returns at once."""
        with self._condition:
            self._stopping = True
            for queue in self._queues.values():
                for job in queue:
                    job._change(state="cancelled", cancel_requested=True, finished_at=time.time())
                queue.clear()
            running = self._running
            self._condition.notify_all()
        if running is not None:
            self.cancel(running)

    @property
    def runs(self) -> int:
        """Jobs started since the server started (the first one boots the engine; later ones find it warm)."""
        return self._started_runs

    # -- the runner thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._stopping and not any(self._queues.values()):
                    self._condition.wait()
                if self._stopping:
                    return
                job = self._next()
                self._running = job
                job._change(state="running", started_at=time.time())
                self._started_runs += 1
            try:
                self._run(job)
            except BaseException:  # nothing a query raises may stop the runner: the next job must run
                LOG.exception("query %s ended the runner's step", job.id)
                if not job.done:
                    job._change(state="failed", error=error_body(RuntimeError()), finished_at=time.time())
            finally:
                with self._condition:
                    self._running = None
                    self._forget_old()

    def _next(self) -> QueryJob:
        """The first job of the first client in turn with one; that client goes to the back of the turn."""
        for client, queue in self._queues.items():
            if queue:
                job = queue.popleft()
                if queue:
                    self._queues.move_to_end(client)
                else:  # a client with nothing waiting holds no place: the names clients send do not pile up
                    del self._queues[client]
                return job
        raise AssertionError("called with every queue empty")

    def _queued_order(self) -> list[QueryJob]:
        """The queued jobs in the order the runner will take them (round robin over the clients in turn)."""
        queues = [list(q) for q in self._queues.values() if q]
        order = []
        for depth in range(max((len(q) for q in queues), default=0)):
            order += [q[depth] for q in queues if depth < len(q)]
        return order

    def _run(self, job: QueryJob) -> None:
        self.session.database.resume()
        try:
            result = self.session.sql(job.sql, dialect=job.dialect).run()
            if job.cancel_requested:
                raise Cancelled()
            self._check_size(result)
        except BaseException as error:  # every outcome is the job's; the runner goes on with the next
            if job.cancel_requested:  # whatever the stop raised (Cancelled, DuckDB's interruption): the cancel is news
                job._change(state="cancelled", finished_at=time.time())
                return
            if not isinstance(error, Exception):
                raise
            if not isinstance(error, QuailError):
                LOG.exception("query %s failed", job.id)
            job._change(state="failed", error=error_body(error), finished_at=time.time())
        else:
            job._finish(result)

    def _check_size(self, result: QueryResult) -> None:
        size = result.collect().nbytes
        if size > self.max_result_bytes:
            raise ResultTooLarge(f"the result is {size:,} bytes ({result.count():,} rows), more than this server sends "
                                 f"({self.max_result_bytes:,} bytes, --max-result-bytes): add a LIMIT or aggregate")

    def _progress(self, node: PhysicalNode, done: int, total: int) -> None:
        """The session's progress listener: the running job's bars; where a cancelled job stops."""
        job = self._running
        if job is None:
            return
        if job.cancel_requested:
            raise Cancelled()
        job._progressed(node, done, total)

    def _forget_old(self) -> None:
        """Forget the oldest finished jobs beyond `KEPT_JOBS`, and beyond what their rows may take in memory."""
        finished = [job_id for job_id, job in self._jobs.items() if job.done]
        for job_id in finished[:max(0, len(self._jobs) - KEPT_JOBS)]:
            del self._jobs[job_id]
        held = {job_id: job.result.collect().nbytes for job_id, job in self._jobs.items() if job.result is not None}
        excess = sum(held.values()) - KEPT_RESULTS * self.max_result_bytes
        for job_id, size in held.items():  # oldest first
            if excess <= 0:
                break
            del self._jobs[job_id]
            excess -= size

