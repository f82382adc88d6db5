"""A real `quail serve` process on 127.0.0.1 for the tests: started with its own TMPDIR, its address read from
what it prints, stopped with SIGTERM (and checked to leave nothing behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

import quail
from quail.datasets import __file__ as _datasets_init
from quail.runtime.results import QueryResult

DATASETS = Path(_datasets_init).parent
TOKEN = "test-token-0123456789abcdef"
START_TIMEOUT_S = 120.0


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]
    scratch: Path
    token: str | None
    printed: list[str]

    def client(self, token: str | None = None, timeout: float = 60.0) -> httpx.Client:
        chosen = self.token if token is None else token
        headers = {"Authorization": f"Bearer {chosen}"} if chosen else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, wait_s: float = 60.0) -> int:
        """Signal the server and wait for it to exit; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def left_behind(self) -> list[str]:
        return sorted(p.name for p in self.scratch.iterdir())


def start_server(tmp_path: Path, *arguments: str, token: str | None = TOKEN,
                 env: dict[str, str] | None = None) -> Server:
    """`quail serve --port 0 ...` with the bundled reviews and aspects registered; waits until it listens."""
    scratch = tmp_path / "server-tmp"
    scratch.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "quail.cli", "serve", "--port", "0",
               "-t", f"reviews={DATASETS / 'reviews.jsonl'}:id", "-t", f"aspects={DATASETS / 'aspects.jsonl'}:id",
               *(["--token", token] if token else []), *arguments]
    environment = {**os.environ, "TMPDIR": str(scratch), "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment,
                               preexec_fn=_default_signals)
    printed: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"quail serve exited ({process.wait()}):\n{''.join(printed)}")
        printed.append(line)
        if line.startswith("quail serve: http://"):
            url = line.split(": ", 1)[1].strip().split("#")[0].rstrip("/")
            os.set_blocking(process.stdout.fileno(), False)
            return Server(url, process, scratch, token, printed)
    process.kill()
    raise AssertionError(f"quail serve did not start in {START_TIMEOUT_S} s:\n{''.join(printed)}")


def _default_signals() -> None:
    """SIGINT as in a terminal, even when the tests run as a background job (which starts with it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(client: httpx.Client, job_id: str, states: tuple[str, ...], timeout_s: float = 120.0) -> dict:
    """The job's snapshot once it is in one of `states`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/queries/{job_id}").json()
        if job["state"] in states:
            return job
        time.sleep(0.05)
    raise AssertionError(f"query {job_id} not in {states} after {timeout_s} s: {job}")


def run_at_once(server: Server, statements: dict[str, str], timeout_s: float = 300.0) -> dict[str, QueryResult]:
    """Each client (its name → its SQL) runs its statement through `quail.connect`, all on their own threads at
    once; their results by client."""
    results: dict[str, QueryResult] = {}

    def work(name: str, sql: str) -> None:
        with quail.connect(server.url, token=server.token, client=name) as remote:
            results[name] = remote.sql(sql).run()

    threads = [threading.Thread(target=work, args=pair) for pair in statements.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert set(results) == set(statements), f"clients without a result: {set(statements) - set(results)}"
    return results
