"""The worker process of the `process` provider: `python -m quail.compute.worker READ_FD WRITE_FD [SETUP]`.

It loads the installed plugins into its own registry (plus the `module:function` setup hook, if
given), then answers requests one by one until its input closes, keeping every engine it boots in
its runtime state. SIGINT is ignored (the caller decides when to stop it), and it exits when its
parent process goes away, so a killed caller never leaves it behind.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection

from quail.backends.base import BackendExecutionContext, RuntimeState
from quail.compute.request import PhysicalResponse
from quail.compute.wire import Frames, Message, decode_request, encode_error, encode_progress, encode_response, receive
from quail.physical.nodes import PhysicalNode
from quail.plugins.registry import ExtensionRegistry
from quail.serving.engines import release_all, serve

PARENT_CHECK_S = 1.0


class _Worker:
    def __init__(self, answers: Connection, setup: str | None) -> None:
        self.answers = answers
        self.setup = setup
        self.state: RuntimeState = {}
        self._registry: ExtensionRegistry | None = None

    def registry(self) -> ExtensionRegistry:
        """The installed plugins, then the setup hook: on the first request, so its failure is that request's."""
        if self._registry is None:
            registry = ExtensionRegistry.with_built_ins()
            if self.setup:
                module, function = self.setup.split(":")
                getattr(importlib.import_module(module), function)(registry)
            self._registry = registry
        return self._registry

    def send(self, frames: Frames) -> None:
        for frame in frames:
            self.answers.send_bytes(frame)

    def progress(self, node: PhysicalNode, done: int, total: int) -> None:
        self.send(encode_progress(node.id, done, total))

    def answer(self, received: Message) -> PhysicalResponse:
        request = decode_request(received)
        return serve(BackendExecutionContext(request, self.registry(), self.state, self.progress))

    def serve(self, requests: Connection) -> None:
        while True:
            try:
                received = receive(requests.recv_bytes)
            except EOFError:
                return
            try:
                frames = encode_response(self.answer(received))
            except Exception as error:  # every failure goes back to the caller as data
                frames = encode_error(error)
            self.send(frames)


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(3)

    threading.Thread(target=watch, name="quail-parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    read_fd, write_fd = int(argv[0]), int(argv[1])
    for fd in (read_fd, write_fd):
        os.set_inheritable(fd, False)  # an engine's own subprocesses must not hold the pipes open
    _exit_with_parent()
    requests, answers = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    worker = _Worker(answers, argv[2] if len(argv) > 2 else None)
    try:
        worker.serve(requests)
    finally:
        release_all(worker.state)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
