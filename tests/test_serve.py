"""`quail serve` over real HTTP on 127.0.0.1: every endpoint, bad input, tokens, the client, fairness, faults.

The server here answers with the keyword backend (the example plugin's), so rows can be compared with a local
session's exactly; the real-model faults (cancel and SIGTERM during model work) are in test_serve_models.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

import pyarrow as pa
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from support.serving import DATASETS, TOKEN, run_at_once, start_server, wait_for  # noqa: E402

import quail  # noqa: E402
from quail.config import EngineConfig  # noqa: E402
from quail.errors import CompileError, QuailError, QueryCancelledError, Refusal, RefusalError, ServerError  # noqa: E402
from quail.server.jobs import QueryJob, Scheduler, error_body  # noqa: E402

BACKEND = ("--backend", "example-keyword")
FILTER = "SELECT r.id, r.title FROM reviews r WHERE AI_FILTER(PROMPT('Is this review positive? {0}', r.body))"
JOIN = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
        "ON AI_FILTER(PROMPT('Does the review {0} praise the {1}?', r.body, a.aspect)) WHERE r.id <= 8")
GROUPED = ("SELECT r.sentiment, COUNT(*) AS n FROM reviews r "
           "WHERE AI_FILTER(PROMPT('Is this review positive? {0}', r.body)) GROUP BY r.sentiment ORDER BY 1")
BAD = "SELECT r.id\nFROM reviews r\nWHERE AI_FILTER(PROMPT('Is it good? {0}', r.nope))"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    started = start_server(tmp_path_factory.mktemp("serve"), *BACKEND)
    yield started
    assert started.stop() in (0, 143)
    assert started.left_behind() == []


@pytest.fixture(scope="module")
def api(server):
    with server.client() as client:
        yield client


def local(sql: str) -> pa.Table:
    """What a local session on the same backend and tables answers (its own answers, not the server's stored ones)."""
    with quail.Session(EngineConfig(backend="example-keyword", cache="off")) as session:
        session.register("reviews", str(DATASETS / "reviews.jsonl"), id_column="id")
        session.register("aspects", str(DATASETS / "aspects.jsonl"), id_column="id")
        return session.sql(sql).run().collect()


def run_job(api, sql: str, dialect: str = "snowflake") -> dict:
    submitted = api.post("/v1/queries", json={"sql": sql, "dialect": dialect})
    assert submitted.status_code == 202, submitted.text
    return wait_for(api, submitted.json()["id"], ("finished", "failed", "cancelled"))


def arrow(response) -> pa.Table:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/vnd.apache.arrow.stream"
    return pa.ipc.open_stream(response.content).read_all()


# -- every endpoint ----------------------------------------------------------------------------------------------


def test_info_tables_and_backends_describe_the_server(api):
    info = api.get("/v1/info").json()
    assert info["backend"] == "example-keyword" and info["compute"] == "local"
    tables = {t["name"]: t for t in api.get("/v1/tables").json()["tables"]}
    assert set(tables) == {"reviews", "aspects"}
    assert {"name": "body", "type": "string"} in tables["reviews"]["columns"]
    assert tables["reviews"]["id_column"] == "id"
    backends = {b["name"]: b for b in api.get("/v1/backends").json()["backends"]}
    assert backends["example-keyword"]["status"] == "supported"
    assert api.get("/v1/health").json() == {"status": "ok"}


def test_a_query_runs_and_its_rows_are_a_local_sessions_rows_in_arrow_and_json(api):
    job = run_job(api, JOIN)
    assert job["state"] == "finished"
    expected = local(JOIN)
    rows = arrow(api.get(f"/v1/queries/{job['id']}/result"))
    assert rows.equals(expected)
    assert job["rows"] == expected.num_rows and [c["name"] for c in job["columns"]] == ["id", "aspect"]
    page = api.get(f"/v1/queries/{job['id']}/result", params={"format": "json", "offset": 3, "limit": 4}).json()
    assert page["total"] == expected.num_rows and page["offset"] == 3
    assert page["rows"] == expected.slice(3, 4).to_pylist()
    assert job["report"]["backend"] == "example-keyword" and job["report"]["wall_s"] > 0
    assert "AiJoin" in job["explain"]
    assert [p["done"] == p["total"] for p in job["progress"]] == [True] * len(job["progress"]) and job["progress"]
    node = job["answers"][0]
    answers = arrow(api.get(f"/v1/queries/{job['id']}/answers/{node}"))
    assert answers.num_rows > 0
    listed = api.get("/v1/queries").json()["queries"]
    assert job["id"] in [q["id"] for q in listed]


def test_both_dialects_and_explain_without_running(api):
    sql = "SELECT r.id FROM reviews r WHERE AI.IF(('Is this review positive? ', r.body))"
    job = run_job(api, sql, dialect="bigquery")
    assert job["state"] == "finished" and job["rows"] == local(FILTER).num_rows
    runs = api.get("/v1/info").json()["runs"]
    plan = api.post("/v1/explain", json={"sql": FILTER})
    assert plan.status_code == 200 and "AiFilter" in plan.json()["explain"]
    assert api.get("/v1/info").json()["runs"] == runs  # explain ran nothing
    assert api.post("/v1/compile", json={"sql": FILTER}).json() == {"ok": True}


def test_the_event_stream_sends_snapshots_until_a_last_done_event(api):
    job_id = api.post("/v1/queries", json={"sql": FILTER}).json()["id"]
    events = []
    with api.stream("GET", f"/v1/queries/{job_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in stream.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line[5:])))
    assert events[-1][0] == "done" and events[-1][1]["state"] == "finished"
    assert all(name == "status" for name, _ in events[:-1])
    versions = [body["version"] for _, body in events]
    assert versions == sorted(set(versions))


# -- errors keep their kinds --------------------------------------------------------------------------------------


def test_a_compile_error_is_400_with_the_local_message_and_position(api):
    with pytest.raises(CompileError) as local_error:
        local(BAD)
    for path in ("/v1/queries", "/v1/compile", "/v1/explain"):
        response = api.post(path, json={"sql": BAD})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["kind"] == "CompileError"
        assert error["message"] == str(local_error.value)
        assert (error["line"], error["column"]) == (local_error.value.line, local_error.value.column)
    assert api.get("/v1/info").json()["queued"] == 0


@pytest.mark.parametrize(("body", "status", "words"), [
    (b"{not json", 400, "not JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b"{}", 400, "sql must be"),
    (b'{"sql": "   "}', 400, "sql must be"),
    (b'{"sql": "SELECT 1", "model": "x"}', 400, "unknown field(s) model"),
    (b'{"sql": "SELECT 1", "dialect": "oracle"}', 400, "dialect 'oracle'"),
    (b"\xff\xfe", 400, "not JSON"),
])
def test_malformed_requests_are_400_naming_what_was_wrong(api, body, status, words):
    response = api.post("/v1/queries", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert words in response.json()["error"]["message"]


def test_a_huge_body_is_413_before_it_is_read_whole_declared_or_chunked(api):
    huge = json.dumps({"sql": "SELECT 1 -- " + "x" * (2 << 20)}).encode()
    assert api.post("/v1/queries", content=huge).status_code == 413

    def chunks():
        for _ in range(64):
            yield b"x" * 65536

    response = api.post("/v1/queries", content=chunks())  # no Content-Length: read until over the limit
    assert response.status_code == 413 and response.json()["error"]["kind"] == "TooLarge"
    assert api.get("/v1/health").status_code == 200


def test_a_wrong_or_missing_token_is_401_and_health_needs_none(server):
    for token in ("wrong-token-0123456789", ""):
        with server.client(token=token) as client:
            client.headers.pop("Authorization", None) if not token else None
            response = client.get("/v1/tables")
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert client.post("/v1/queries", json={"sql": FILTER}).status_code == 401
            assert client.get("/v1/health").status_code == 200
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.get("/v1/info").status_code == 401
        assert anonymous.get("/").status_code == 200  # the page holds no data; its API calls send the token


def test_unknown_ids_paths_methods_and_pages(api):
    assert api.get("/v1/queries/nope").status_code == 404
    assert api.post("/v1/queries/nope/cancel").status_code == 404
    assert api.get("/v1/nothing").json()["error"]["kind"] == "NotFound"
    assert api.delete("/v1/tables").status_code == 405
    job = run_job(api, FILTER)
    assert api.get(f"/v1/queries/{job['id']}/result", params={"format": "json", "offset": "-1"}).status_code == 400
    assert api.get(f"/v1/queries/{job['id']}/result", params={"format": "csv"}).status_code == 400
    assert api.get(f"/v1/queries/{job['id']}/answers/no_such_node").status_code == 404


def test_pages_carry_no_script_from_elsewhere(api):
    page = api.get("/")
    assert page.status_code == 200 and "<textarea id=\"sql\"" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert api.get("/static/app.js").status_code == 200


def test_a_client_cannot_name_a_file_on_the_server(api, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("id,body\n1,hidden\n")
    sql = f"SELECT s.id FROM read_csv('{secret}') s WHERE AI_FILTER(PROMPT('Is it hidden? {{0}}', s.body))"
    job = api.post("/v1/queries", json={"sql": sql})
    if job.status_code == 202:
        job = wait_for(api, job.json()["id"], ("finished", "failed", "cancelled"))
        assert job["state"] == "failed"
        assert job["error"]["kind"] in ("CompileError", "QuailError")
    else:
        assert job.status_code == 400
    assert "hidden" not in json.dumps(job if isinstance(job, dict) else job.json())


# -- the Python client ------------------------------------------------------------------------------------------


def test_the_client_gives_the_objects_a_local_session_gives(server):
    with quail.connect(server.url, token=TOKEN) as remote:
        assert remote.tables()["reviews"][:3] == ["id", "title", "body"]
        query = remote.sql(JOIN)
        assert "AiJoin" in query.explain()
        heard = []
        result = query.run(progress=lambda node, text, done, total: heard.append((node, done, total)))
        assert result.collect().equals(local(JOIN))
        assert result.to_pandas().equals(local(JOIN).to_pandas())
        assert result.report["backend"] == "example-keyword" and result.report["fresh_tokens"] >= 0
        assert "AiJoin" in result.explain()
        assert heard and heard[-1][1] == heard[-1][2]
        node = next(iter(result.answer_tables))
        assert result.answer_tables[node].num_rows > 0
        with pytest.raises(CompileError) as error:
            remote.sql(BAD)
        assert error.value.line == 3 and "nope" in str(error.value)
        assert remote.sql(GROUPED).collect().equals(local(GROUPED))


def test_the_client_says_what_is_wrong_with_the_server_or_the_token(server):
    with pytest.raises(QuailError, match="valid token"):
        quail.connect(server.url, token="wrong-token-0123456789")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(ServerError, match="cannot reach"):
        quail.connect(f"http://127.0.0.1:{port}")
    with pytest.raises(QuailError, match="not a server address"):
        quail.connect("ftp://x")


def test_errors_cross_the_wire_as_the_same_exceptions():
    from quail.client import _raised

    refusal = Refusal("needs memory", ("the model",), needed=8.0, available=2.0, unit="GiB", hints=("use a smaller",))
    for raised in (RefusalError(refusal), CompileError("bad thing", line=2, column=5)):
        body = error_body(raised)
        back = _raised(body.status, json.dumps({"error": body.as_dict()}).encode())
        assert type(back) is type(raised) and str(back) == str(raised)
    assert body.status == 400 and error_body(RefusalError(refusal)).status == 422
    internal = error_body(ZeroDivisionError("secret detail"))
    assert internal.status == 500 and "secret detail" not in internal.message
    assert isinstance(_raised(500, json.dumps({"error": internal.as_dict()}).encode()), ServerError)
    assert isinstance(_raised(409, b'{"error": {"kind": "Cancelled", "message": "x"}}'), QueryCancelledError)


# -- two clients, fairness, cancel, disconnects -------------------------------------------------------------------


def test_two_clients_at_once_share_the_warm_engine_and_get_local_rows(tmp_path):
    server = start_server(tmp_path, *BACKEND)
    try:
        results = run_at_once(server, {"a": JOIN, "b": FILTER})
        assert results["a"].collect().equals(local(JOIN))
        assert results["b"].collect().equals(local(FILTER))
        boots = sorted(r.report["boot_kind"] for r in results.values())
        assert boots == ["cold", "warm"]  # one engine booted; the other query found it warm
    finally:
        assert server.stop() in (0, 143)
    assert server.left_behind() == []


def finish(*jobs: QueryJob, timeout_s: float = 60.0) -> QueryJob:
    """Wait until every job is done; the last one."""
    deadline = time.monotonic() + timeout_s
    while not all(job.done for job in jobs):
        assert time.monotonic() < deadline, [job.state for job in jobs]
        time.sleep(0.01)
    return jobs[-1]


@dataclass
class Held:
    """A scheduler on a keyword session whose runner waits at its first model step until `release` is set."""

    scheduler: Scheduler
    entered: threading.Event
    release: threading.Event


@pytest.fixture
def held():
    with quail.Session(EngineConfig(backend="example-keyword")) as session:
        session.register("reviews", str(DATASETS / "reviews.jsonl"), id_column="id")
        entered, release = threading.Event(), threading.Event()

        def hold(node, done, total):
            entered.set()
            release.wait(30)

        session.registry.register_progress_listener(hold)
        scheduler = Scheduler(session, max_result_bytes=1 << 30)
        try:
            yield Held(scheduler, entered, release)
        finally:
            release.set()
            scheduler.close(30)


def test_clients_are_served_in_turn_not_in_the_order_one_client_floods_the_queue(held):
    scheduler = held.scheduler
    first = scheduler.submit(QueryJob(FILTER, "snowflake", "alice"))
    assert held.entered.wait(30)
    alice = [scheduler.submit(QueryJob(f"{FILTER} AND r.id > {n}", "snowflake", "alice")) for n in range(3)]
    bob = scheduler.submit(QueryJob(FILTER, "snowflake", "bob"))
    assert [scheduler.position(j) for j in (*alice, bob)] == [0, 2, 3, 1]
    held.release.set()
    finish(first, *alice, bob)
    started = sorted((first, *alice, bob), key=lambda j: j.started_at)
    assert started == [first, alice[0], bob, alice[1], alice[2]]
    assert all(j.state == "finished" for j in started)


def test_a_cancelled_job_stops_queued_or_running_and_the_session_goes_on(held):
    scheduler = held.scheduler
    running = scheduler.submit(QueryJob(FILTER, "snowflake", "a"))
    assert held.entered.wait(30)
    queued = scheduler.submit(QueryJob(FILTER, "snowflake", "a"))
    scheduler.cancel(queued)
    assert queued.state == "cancelled" and queued.started_at is None
    scheduler.cancel(running)
    held.release.set()
    finish(running)
    assert running.state == "cancelled" and running.result is None
    after = finish(scheduler.submit(QueryJob(FILTER, "snowflake", "a")))
    assert after.state == "finished" and after.result.collect().equals(local(FILTER).select(["id", "title"]))


def test_a_result_over_the_limit_is_413_naming_the_limit(tmp_path):
    server = start_server(tmp_path, *BACKEND, "--max-result-bytes", "64")
    try:
        with server.client() as api:
            job = run_job(api, JOIN)
            assert job["state"] == "failed" and job["error"]["kind"] == "ResultTooLarge"
            response = api.get(f"/v1/queries/{job['id']}/result")
            assert response.status_code == 413 and "--max-result-bytes" in response.json()["error"]["message"]
            assert run_job(api, "SELECT COUNT(*) AS n FROM reviews r WHERE AI_FILTER(PROMPT('Good? {0}', r.body))"
                           )["state"] == "finished"
    finally:
        server.stop()
    assert server.left_behind() == []


def test_a_client_that_disconnects_mid_stream_leaves_the_server_serving(server, api):
    job_id = api.post("/v1/queries", json={"sql": JOIN}).json()["id"]
    host, port = server.url.removeprefix("http://").split(":")
    for path in (f"/v1/queries/{job_id}/events", f"/v1/queries/{job_id}/result"):
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            assert raw.recv(64).startswith(b"HTTP/1.1")
        wait_for(api, job_id, ("finished",))
    assert arrow(api.get(f"/v1/queries/{job_id}/result")).equals(local(JOIN))
    assert run_job(api, FILTER)["state"] == "finished"


def test_any_other_address_than_loopback_gets_a_printed_token(tmp_path):
    server = start_server(tmp_path, *BACKEND, "--host", "0.0.0.0", token=None)
    try:
        token = server.printed[-1].strip().split("#token=")[1]
        assert len(token) >= 24
        url = server.url.replace("0.0.0.0", "127.0.0.1")
        with httpx.Client(base_url=url) as anonymous:
            assert anonymous.get("/v1/tables").status_code == 401
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
            assert client.get("/v1/tables").status_code == 200
    finally:
        server.stop()


def test_loopback_without_a_token_asks_for_none(tmp_path):
    server = start_server(tmp_path, *BACKEND, token=None)
    try:
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/v1/tables").status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize(("arguments", "words"), [
    (("--token", "short"), "at least 16"),
    (("--external-access",), "unrecognized arguments"),
    (("--port", "70000"), "not a TCP port"),
    (("-t", "x=/no/such/file.parquet"), "no file or directory"),
])
def test_bad_serve_options_exit_2_before_listening(tmp_path, arguments, words):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "quail.cli", "serve", *BACKEND, *arguments], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_a_config_file_registers_tables_and_engine_settings(tmp_path):
    config = tmp_path / "serve.toml"
    config.write_text(f'[server]\ndialect = "bigquery"\n[engine]\nbackend = "example-keyword"\n'
                      f'[tables]\ncritiques = "{DATASETS / "reviews.jsonl"}:id"\n')
    server = start_server(tmp_path, "--config", str(config))
    try:
        with server.client() as api:
            assert api.get("/v1/info").json()["dialect"] == "bigquery"
            assert {t["name"] for t in api.get("/v1/tables").json()["tables"]} == {"critiques", "reviews", "aspects"}
    finally:
        server.stop()
    config.write_text('[engine]\nmodle = "x"\n')
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "quail.cli", "serve", "--config", str(config)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and "unknown key(s) in [engine]: modle" in done.stderr


def test_a_refusal_at_run_time_is_422_with_its_parts_and_the_client_raises_it(tmp_path):
    refusing = quail.Session(EngineConfig(backend="example-keyword", chunk_tokens=64, cache="off"))
    with refusing as session, pytest.raises(RefusalError) as expected:
        session.register("reviews", str(DATASETS / "reviews.jsonl"), id_column="id")
        session.sql(FILTER).run()
    server = start_server(tmp_path, *BACKEND, "--chunk-tokens", "64")
    try:
        with server.client() as api:
            job = run_job(api, FILTER)
            assert job["state"] == "failed" and job["error"]["kind"] == "RefusalError"
            assert job["error"]["refusal"]["needed"] == expected.value.refusal.needed
            response = api.get(f"/v1/queries/{job['id']}/result")
            assert response.status_code == 422 and response.json()["error"]["message"] == str(expected.value)
        with quail.connect(server.url, token=TOKEN) as remote, pytest.raises(RefusalError) as raised:
            remote.sql(FILTER).run()
        assert raised.value.refusal == expected.value.refusal
    finally:
        server.stop()
    assert server.left_behind() == []


BROKEN_PLUGIN = """
import quail
from quail.testing import KeywordBackend
from quail.testing.backend import KeywordExecution


class BrokenExecution(KeywordExecution):
    def execute(self, node, inputs):
        raise RuntimeError("secret internals of the broken backend")


class BrokenBackend(KeywordBackend):
    name = "broken"

    def start(self, context):
        return BrokenExecution(self._tokenizer)


@quail.hookimpl
def quail_register(registry):
    registry.register_backend(BrokenBackend())
"""


def test_an_internal_fault_is_500_without_its_details_and_the_server_goes_on(tmp_path, install_plugin):
    install_plugin("quail-broken", "broken", BROKEN_PLUGIN)
    server = start_server(tmp_path, "--backend", "broken", env={"PYTHONPATH": str(tmp_path / "site")})
    try:
        with server.client() as api:
            for _ in range(2):
                job = run_job(api, FILTER)
                assert job["state"] == "failed" and job["error"]["kind"] == "InternalError"
                assert "secret internals" not in json.dumps(job)
                assert api.get(f"/v1/queries/{job['id']}/result").status_code == 500
            assert api.get("/v1/health").json() == {"status": "ok"}
        with quail.connect(server.url, token=TOKEN) as remote, pytest.raises(ServerError, match="InternalError"):
            remote.sql(FILTER).run()
    finally:
        server.stop()
    log = "".join(server.printed) + (server.process.stdout.read() or "")
    assert "secret internals of the broken backend" in log  # the traceback is the server's, in its log
    assert server.left_behind() == []


def test_a_server_on_the_process_provider_keeps_its_worker_warm_and_stops_it_on_sigterm(tmp_path):
    import psutil

    server = start_server(tmp_path, *BACKEND, "--compute", "process")
    try:
        with quail.connect(server.url, token=TOKEN) as remote:
            first, second = remote.sql(FILTER).run(), remote.sql(JOIN).run()
        assert (first.report["boot_kind"], second.report["boot_kind"]) == ("cold", "warm")
        assert second.collect().equals(local(JOIN))
        workers = psutil.Process(server.process.pid).children(recursive=True)
        assert workers  # the engine lives in a worker process
    finally:
        assert server.stop() == 143
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert server.left_behind() == []


def test_finished_results_are_kept_up_to_a_bound_then_forgotten_oldest_first():
    size = local(FILTER).nbytes
    with quail.Session(EngineConfig(backend="example-keyword")) as session:
        session.register("reviews", str(DATASETS / "reviews.jsonl"), id_column="id")
        scheduler = Scheduler(session, max_result_bytes=size)
        try:
            jobs = []
            for _ in range(7):
                jobs.append(finish(scheduler.submit(QueryJob(FILTER, "snowflake", "a"))))
            kept = [scheduler.job(j.id) is not None for j in jobs]
            assert kept == [False, False, False, True, True, True, True]
        finally:
            scheduler.close(30)
