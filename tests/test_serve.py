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

import quail
from quail.config import EngineConfig
from quail.errors import (
    CompileError,
    QuailError,
    QueryCancelledError,
    Refusal,
    RefusalError,
    ServerError,
    WorkerLostError,
)
from quail.server.jobs import QueryJob, Scheduler, error_body

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from support.serving import DATASETS, TOKEN, run_at_once, start_server, wait_for  # noqa: E402

BACKEND = ("--backend", "example-keyword")
FILTER = "SELECT r.id, r.title FROM reviews r WHERE AI_FILTER(PROMPT('Is this review positive? {0}', r.body))"
JOIN = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
        "ON AI_FILTER(PROMPT('Does the review {0} praise the {1}?', r.body, a.aspect)) WHERE r.id <= 8")
GROUPED = ("SELECT r.sentiment, COUNT(*) AS n FROM reviews r "
           "WHERE AI_FILTER(PROMPT('Is this review positive? {0}', r.body)) GROUP BY r.sentiment ORDER BY 1")
BAD = "SELECT r.id\nFROM reviews r\nWHERE AI_FILTER(PROMPT('Is it good? {0}', r.nope))"
JSON = {"Content-Type": "application/json"}
NEVER_ENDING = "SELECT COUNT(*) AS n FROM " + ", ".join(f"reviews t{i}" for i in range(8))
"""A relational statement DuckDB would work on for hours (64⁸ rows)."""


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
    assert page["rows"] == [list(row.values()) for row in expected.slice(3, 4).to_pylist()]
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
    assert api.post("/v1/queries", content=huge, headers=JSON).status_code == 413

    def chunks():
        for _ in range(64):
            yield b"x" * 65536

    response = api.post("/v1/queries", content=chunks(), headers=JSON)  # no Content-Length: read until too long
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
    assert api.post("/v1/queries/nope/cancel", json={}).status_code == 404
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
    lost = error_body(WorkerLostError("compute worker process 7 was killed by signal SIGKILL"))
    assert lost.status == 503 and "SIGKILL" in lost.message  # the workers failed, not the request
    back = _raised(lost.status, json.dumps({"error": lost.as_dict()}).encode())
    assert type(back) is WorkerLostError and str(back) == lost.message


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
                      f'model_aliases = {{ "gemini-2.5-flash" = "gemma-3-270m" }}\n'
                      f'[tables]\ncritiques = "{DATASETS / "reviews.jsonl"}:id"\n')
    server = start_server(tmp_path, "--config", str(config))
    try:
        with server.client() as api:
            assert api.get("/v1/info").json()["dialect"] == "bigquery"
            named = "SELECT c.id FROM critiques c WHERE AI.IF(('Is it good? ', c.body), endpoint => 'gemini-2.5-flash')"
            assert "model gemma-3-270m;" in api.post("/v1/explain", json={"sql": named}).json()["explain"]
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


def test_json_pages_say_every_value_unambiguously_and_keep_columns_of_one_name(api):
    sql = ("SELECT r.id, r.title AS id, CAST(r.stars AS DECIMAL(5, 2)) AS d, DATE '2026-01-02' AS day, "
           "TIMESTAMP '2026-01-02 03:04:05' AS at, INTERVAL 3 DAY AS span, 'ab'::BLOB AS raw, "
           "[1.5, 'nan'::DOUBLE] AS xs, {'k': r.stars} AS s FROM reviews r "
           "WHERE AI_FILTER(PROMPT('Is this review positive? {0}', r.body)) ORDER BY r.id LIMIT 1")
    job = run_job(api, sql)
    assert job["state"] == "finished", job
    page = api.get(f"/v1/queries/{job['id']}/result", params={"format": "json"}).json()
    assert [c["name"] for c in page["columns"]] == ["id", "id", "d", "day", "at", "span", "raw", "xs", "s"]
    row = local(sql).to_pylist()[0]
    (got,) = page["rows"]
    assert got[0] == 2 and got[1] == local(sql).column(1)[0].as_py()
    assert got[2] == f"{row['d']}" and got[3] == "2026-01-02" and got[4] == "2026-01-02T03:04:05"
    assert got[5] == {"months": 0, "days": 3, "nanoseconds": 0}
    assert got[6] == "YWI=" and got[7] == [1.5, None] and got[8] == {"k": row["s"]["k"]}
    for bad in ("\u00b2", "\u0661", "1e3"):
        response = api.get(f"/v1/queries/{job['id']}/result", params={"format": "json", "offset": bad})
        assert response.status_code == 400, bad


def test_a_post_that_is_not_json_is_415_so_no_other_site_can_submit_one(api):
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": kind} if kind else {}
        response = api.post("/v1/queries", content=json.dumps({"sql": FILTER}), headers=headers)
        assert response.status_code == 415 and response.json()["error"]["kind"] == "UnsupportedMediaType"
    assert api.post("/v1/compile", content=json.dumps({"sql": FILTER}),
                    headers={"Content-Type": "application/json; charset=utf-8"}).status_code == 200


def test_without_a_token_only_requests_addressed_to_loopback_are_answered(tmp_path):
    server = start_server(tmp_path, *BACKEND, token=None)
    port = server.url.rsplit(":", 1)[1]
    try:
        with httpx.Client(base_url=server.url) as client:
            for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
                assert client.get("/v1/tables", headers={"Host": host}).status_code == 200, host
            for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example"):
                response = client.get("/v1/tables", headers={"Host": host})
                assert response.status_code == 403 and response.json()["error"]["kind"] == "Forbidden", host
                assert client.get("/", headers={"Host": host}).status_code == 403
    finally:
        server.stop()


def test_a_cancel_stops_a_running_duckdb_statement_and_the_next_query_runs(api):
    job_id = api.post("/v1/queries", json={"sql": NEVER_ENDING}).json()["id"]
    wait_for(api, job_id, ("running",))
    time.sleep(0.5)  # inside DuckDB by now
    asked = time.monotonic()
    api.post(f"/v1/queries/{job_id}/cancel", json={})
    assert wait_for(api, job_id, ("cancelled", "failed", "finished"), timeout_s=30)["state"] == "cancelled"
    assert time.monotonic() - asked < 10
    assert run_job(api, FILTER)["state"] == "finished"


def test_a_cancel_between_statements_stops_the_query_at_its_next_one(held):
    scheduler = held.scheduler
    job = scheduler.submit(QueryJob(f"{FILTER} ORDER BY (SELECT COUNT(*) FROM reviews x, reviews y)",
                                    "snowflake", "a"))
    assert held.entered.wait(30)  # the model part is answered; its relational part has not begun
    scheduler.cancel(job)
    held.release.set()
    finish(job)
    assert job.state == "cancelled" and job.result is None
    assert finish(scheduler.submit(QueryJob(FILTER, "snowflake", "a"))).state == "finished"


def test_a_client_whose_queue_is_full_is_told_so_and_others_are_not(held, monkeypatch):
    from quail.server import jobs

    monkeypatch.setattr(jobs, "MAX_QUEUED_PER_CLIENT", 2)
    scheduler = held.scheduler
    scheduler.submit(QueryJob(FILTER, "snowflake", "a"))
    assert held.entered.wait(30)
    for _ in range(2):
        scheduler.submit(QueryJob(FILTER, "snowflake", "a"))
    with pytest.raises(jobs.QueueFull, match="2 of them this client's"):
        scheduler.submit(QueryJob(FILTER, "snowflake", "a"))
    assert error_body(jobs.QueueFull("x")).status == 429
    scheduler.submit(QueryJob(FILTER, "snowflake", "b"))


def test_the_client_waits_on_a_quiet_query_longer_than_its_request_timeout(server):
    sql = "SELECT COUNT(*) AS n FROM " + ", ".join(f"reviews t{i}" for i in range(6))
    with quail.connect(server.url, token=TOKEN, timeout_s=2) as remote:
        assert remote.sql(sql).collect().column("n").to_pylist() == [64 ** 6]


def test_a_signal_handed_to_the_server_never_waits_on_a_lock_the_interrupted_thread_holds():
    from quail.server.command import _server_class

    uvicorn = pytest.importorskip("uvicorn")
    held_lock = threading.Lock()
    stopped = threading.Event()

    class State:
        def begin_stopping(self):
            with held_lock:
                stopped.set()

    server = _server_class()(uvicorn.Config(lambda *a: None), State())
    with held_lock:  # as if the signal landed while the event loop held a job's lock
        began = time.monotonic()
        server.handle_exit(15, None)
        assert time.monotonic() - began < 1 and server.should_exit
    assert stopped.wait(5)
