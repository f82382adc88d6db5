"""`quail serve` on a real model (Gemma 3 270M on the native backend): two clients share the warm engine and get a
local session's rows; a query is cancelled during model work and the server goes on; SIGTERM during model work
stops the server cleanly with nothing left behind."""

from __future__ import annotations

import json
import signal
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from support.serving import DATASETS, TOKEN, run_at_once, start_server, wait_for

import quail
from quail.config import EngineConfig

pytestmark = pytest.mark.slow

MODEL = ("--model", "gemma-3-270m")
POSITIVE = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))"
ACTING = ("SELECT r.id, r.title FROM reviews r "
          "WHERE AI_FILTER(PROMPT('Does the review praise the acting? {0}', r.body)) AND r.stars >= 3")
LONG = ("SELECT a.id, b.id AS other FROM reviews a JOIN reviews b "
        "ON AI_FILTER(PROMPT('Do the reviews {0} and {1} agree about the film?', a.body, b.body))")


def local(sql: str):
    with quail.Session(EngineConfig(model="gemma-3-270m", cache="off")) as session:
        session.register("reviews", str(DATASETS / "reviews.jsonl"), id_column="id")
        return session.sql(sql).run().collect()


def first_progress(client, job_id: str, timeout_s: float = 120.0) -> dict:
    """The job's snapshot once its model work has reported progress (read from its event stream)."""
    with client.stream("GET", f"/v1/queries/{job_id}/events", timeout=timeout_s) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                body = json.loads(line[5:])
                if body["state"] == "running" and body["progress"]:
                    return body
                assert body["state"] in ("queued", "running"), body
    raise AssertionError("the event stream ended before any progress")


def test_two_clients_share_the_warm_engine_then_a_cancel_during_model_work_leaves_the_server_serving(tmp_path):
    server = start_server(tmp_path, *MODEL)
    try:
        results = run_at_once(server, {"a": POSITIVE, "b": ACTING})
        assert sorted(r.report["boot_kind"] for r in results.values()) == ["cold", "warm"]
        assert results["a"].collect().equals(local(POSITIVE))
        assert results["b"].collect().equals(local(ACTING))

        with server.client() as api:
            job_id = api.post("/v1/queries", json={"sql": LONG}).json()["id"]
            seen = first_progress(api, job_id)
            assert seen["state"] == "running"
            asked = time.monotonic()
            assert api.post(f"/v1/queries/{job_id}/cancel", json={}).status_code == 202
            job = wait_for(api, job_id, ("cancelled", "finished", "failed"), timeout_s=60)
            assert job["state"] == "cancelled", job
            assert time.monotonic() - asked < 30
            assert api.get(f"/v1/queries/{job_id}/result").json()["error"]["kind"] == "Cancelled"
            with quail.connect(server.url, token=TOKEN) as remote:
                again = remote.sql(POSITIVE).run()
            assert again.collect().equals(local(POSITIVE))
            assert again.report["answers"]["computed"] == 0  # the first client's answers, from the answer store
    finally:
        assert server.stop() in (0, 143)
    assert server.left_behind() == []


def test_sigterm_during_model_work_ends_the_stream_cancelled_and_leaves_nothing(tmp_path):
    server = start_server(tmp_path, *MODEL)
    with server.client() as api:
        job_id = api.post("/v1/queries", json={"sql": LONG}).json()["id"]
        first_progress(api, job_id)
        events = []
        with api.stream("GET", f"/v1/queries/{job_id}/events", timeout=60) as stream:
            server.process.send_signal(signal.SIGTERM)
            began = time.monotonic()
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
    code = server.stop(wait_s=60)
    assert code == 128 + signal.SIGTERM
    assert time.monotonic() - began < 45
    assert events and events[-1]["state"] == "cancelled"
    assert server.left_behind() == []
    output = server.process.stdout.read() if server.process.stdout else ""
    assert "Traceback" not in output
