"""`quail serve --compute ray`: the server's queries run on Ray workers it starts, which stay warm from one query
to the next and are gone once SIGTERM has stopped the server (exit 143, not Ray's abort)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest

import quail
from quail.config import EngineConfig

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("ray")

from support.serving import DATASETS, TOKEN, start_server

pytestmark = [pytest.mark.slow, pytest.mark.plugins]

FILTER = "SELECT r.id, r.title FROM reviews r WHERE AI_FILTER(PROMPT('Is this review positive? {0}', r.body))"
JOIN = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
        "ON AI_FILTER(PROMPT('Does the review {0} praise the {1}?', r.body, a.aspect)) WHERE r.id <= 8")


def local(sql: str):
    with quail.Session(EngineConfig(backend="example-keyword", cache="off")) as session:
        session.register("reviews", str(DATASETS / "reviews.jsonl"), id_column="id")
        session.register("aspects", str(DATASETS / "aspects.jsonl"), id_column="id")
        return session.sql(sql).run().collect()


def test_a_server_on_ray_keeps_its_workers_warm_and_leaves_none_after_sigterm(tmp_path, request):
    # Ray keeps its session's logs (under a short path: its sockets' names are limited to 107 bytes); Quail's own
    # scratch is what must be gone
    ray_logs = Path(tempfile.mkdtemp(prefix="qray-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(ray_logs, ignore_errors=True))
    server = start_server(tmp_path, "--backend", "example-keyword", "--compute", "ray", "--workers", "2",
                          "--worker-cpus", "1", env={"RAY_TMPDIR": str(ray_logs)})
    try:
        with quail.connect(server.url, token=TOKEN) as remote:
            first = remote.sql(FILTER).run()
            second = remote.sql(JOIN).run()
        assert first.collect().equals(local(FILTER)) and second.collect().equals(local(JOIN))
        assert first.report["boot_kind"] == "cold" and second.report["boot_kind"] == "warm"
        assert len(second.report["shards"]) >= 1
        workers = [p for p in psutil.Process(server.process.pid).children(recursive=True)
                   if "QuailWorker" in " ".join(p.cmdline()) or "_QueueActor" in " ".join(p.cmdline())]
        assert len(workers) == 3  # two workers and their progress queue
    finally:
        assert server.stop(wait_s=120) == 143
    deadline = time.monotonic() + 30  # Ray's own daemons go on their own time once the cluster is shut down
    while time.monotonic() < deadline and [p for p in workers if _alive(p)]:
        time.sleep(0.2)
    assert not [p.pid for p in workers if _alive(p)]
    assert server.left_behind() == []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
