"""The `process` compute provider: model work in a worker process, one per device.

It proves that everything crossing the boundary is data (the Ray provider needs exactly this), and
it isolates the caller: an engine that crashes or a native library that segfaults is a clear
`WorkerLostError` in the caller's process, which stays usable — the next query starts a new
worker. Workers outlive sessions (their engines stay warm) until `quail.release_engines()` or exit.
Ctrl-C in the caller stops the worker before the KeyboardInterrupt goes on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

from quail.compute.base import Caller
from quail.compute.lifetime import on_release
from quail.compute.request import PhysicalRequest, PhysicalResponse
from quail.compute.rounds import execute_in_rounds, rounds_of
from quail.compute.wire import decode_error, decode_response, encode_request, receive
from quail.errors import WorkerLostError
from quail.physical.graph import PhysicalGraph
from quail.progress import ProgressListener

STOP_WAIT_S = 5.0
WorkerKey = tuple[str, str | None]
"""(device name, worker_setup hook)."""


class WorkerProcess:
    """One worker process and the two pipes to it (requests in, progress / answers / errors out)."""

    def __init__(self, setup: str | None) -> None:
        child_read, parent_write = os.pipe()
        parent_read, child_write = os.pipe()
        command = [sys.executable, "-m", "quail.compute.worker", str(child_read), str(child_write)]
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self.process = subprocess.Popen([*command, *([setup] if setup else [])], pass_fds=(child_read, child_write),
                                            start_new_session=True, env=environment)
        finally:
            os.close(child_read)
            os.close(child_write)
        self.answers = Connection(parent_read, writable=False)
        self.requests = Connection(parent_write, readable=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe(self) -> str:
        return f"compute worker process {self.pid}"

    def call(self, request: PhysicalRequest, progress: ProgressListener | None) -> PhysicalResponse:
        try:
            for frame in encode_request(request):
                self.requests.send_bytes(frame)
            return self._answer(request.graph, progress)
        except (EOFError, OSError):
            raise self._lost() from None
        except BaseException as interrupted:
            if not isinstance(interrupted, Exception):  # Ctrl-C, SIGTERM: the worker stops with the caller's query
                self.stop()
            raise

    def _answer(self, graph: PhysicalGraph, progress: ProgressListener | None) -> PhysicalResponse:
        while True:
            received = receive(self.answers.recv_bytes)
            if received.kind == "response":
                return decode_response(received)
            if received.kind == "error":
                raise decode_error(received, self.describe())
            if received.kind == "progress" and progress is not None:
                header = received.header
                progress(graph.node(str(header["node"])), _int(header["done"]), _int(header["total"]))

    def _lost(self) -> WorkerLostError:
        try:
            code = self.process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            code = self.process.returncode
        self._close_pipes()
        how = f"was killed by signal {signal.Signals(-code).name}" if code is not None and code < 0 else \
            f"exited with code {code}"
        return WorkerLostError(f"{self.describe()} {how} while it ran the query; nothing of that query was "
                               "kept, and the next query starts a new worker")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Close the pipes (the worker exits on end of input), then terminate, then kill."""
        self._close_pipes()
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                try:
                    self.process.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()

    def _close_pipes(self) -> None:
        for connection in (self.requests, self.answers):
            if not connection.closed:
                connection.close()


class _Pool:
    """The worker processes of this process, by (device, setup hook); a dead one is replaced on next use."""

    def __init__(self) -> None:
        self.workers: dict[WorkerKey, WorkerProcess] = {}
        self.lock = threading.Lock()

    def worker(self, key: WorkerKey) -> WorkerProcess:
        with self.lock:
            found = self.workers.get(key)
            if found is None or not found.alive():
                if found is not None:
                    found.stop()
                found = self.workers[key] = WorkerProcess(key[1])
            return found

    def forget(self, key: WorkerKey, worker: WorkerProcess) -> None:
        with self.lock:
            if self.workers.get(key) is worker:
                del self.workers[key]

    def close(self) -> None:
        with self.lock:
            workers, self.workers = list(self.workers.values()), {}
        for worker in workers:
            worker.stop()


POOL = _Pool()
on_release(POOL.close)


class ProcessProvider:
    name = "process"

    def execute(self, request: PhysicalRequest, caller: Caller) -> PhysicalResponse:
        key: WorkerKey = (request.device.name, request.config.worker_setup)
        worker = POOL.worker(key)
        rounds = rounds_of(request)
        try:
            if rounds is None:
                return worker.call(request, caller.progress)
            return execute_in_rounds(request, rounds, lambda part: worker.call(part, caller.progress), "process")
        except BaseException as failure:
            if isinstance(failure, WorkerLostError) or not isinstance(failure, Exception):
                POOL.forget(key, worker)
            raise

    def close(self) -> None:
        POOL.close()


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise ValueError(f"expected an integer from the worker, got {value!r}")
    return value
