"""The HTTP API and the web page of `quail serve`, as a Starlette app over one `ServerState`.

    GET  /                              the web page (static files under /static)
    GET  /v1/health                     liveness, no token asked
    GET  /v1/info                       the engine configuration and the queue
    GET  /v1/tables                     the registered tables and their columns
    GET  /v1/backends                   the installed backends and whether each runs the model here
    POST /v1/compile   {sql, dialect}   compiles only: 200, or the CompileError / RefusalError
    POST /v1/explain   {sql, dialect}   the plan (model work only for a blocked join: its embeddings and recall pilot)
    POST /v1/queries   {sql, dialect}   compiles and queues: 202 with the job
    GET  /v1/queries                    the jobs the server keeps
    GET  /v1/queries/{id}               one job: state, progress, error, report and plan once finished
    GET  /v1/queries/{id}/events        the same as server-sent events, one per change, until it is done
    GET  /v1/queries/{id}/result        the rows: Arrow IPC stream, or ?format=json&offset=&limit= pages
    GET  /v1/queries/{id}/answers/{node} a model node's answers (Arrow IPC stream)
    POST /v1/queries/{id}/cancel        stop it (queued: never runs; running: stops at its next step)

Errors are JSON `{"error": {"kind", "message", ...}}` with the status their kind has (a CompileError 400 with its
line and column, a RefusalError 422, an unknown id 404, a wrong token 401, a body too large 413, internal 500).
Nothing is pickled: requests are JSON, rows are Arrow or JSON.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hmac
import json
import math
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from importlib import resources
from typing import TypeVar

import pyarrow as pa
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from quail.errors import QuailError
from quail.frontend.sql import Dialect
from quail.plugins.status import backend_statuses
from quail.runtime.results import QueryResult
from quail.server.jobs import DONE, LOG, ErrorBody, QueryJob, Scheduler, error_body
from quail.server.settings import ServerSettings
from quail.session import Session

ARROW_STREAM = "application/vnd.apache.arrow.stream"
EVENT_POLL_S = 0.1
KEEPALIVE_S = 15.0
JSON_PAGE_ROWS = 100
MAX_JSON_PAGE_ROWS = 10_000
OPEN_PATHS = ("/v1/health",)
T = TypeVar("T")


@dataclass
class ServerState:
    """The server's two sessions over the same tables: `planning` compiles and explains on the request's
    thread (one at a time, `planning_lock`) while the scheduler's session runs a query."""

    settings: ServerSettings
    planning: Session
    scheduler: Scheduler
    planning_lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    def begin_stopping(self) -> None:
        """Take no new query; cancel the queued ones and ask the running one to stop (without waiting for it)."""
        self.stopping.set()
        self.scheduler.stop()

    def close(self, wait_s: float) -> None:
        """`begin_stopping`, wait up to `wait_s` for the running query to unwind, close both sessions (their files
        go)."""
        self.stopping.set()
        try:
            if self.scheduler.close(wait_s):
                self.scheduler.session.close()
            else:  # its DuckDB connection is still in use: it is closed when the process exits
                LOG.warning("the running query did not stop within %.0f s; its session is left to the exit", wait_s)
        finally:
            self.planning.close()


class ApiError(Exception):
    """A request the API refuses before any work: its status and what was wrong."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.body = ErrorBody(kind, message, status)


def build_app(state: ServerState, on_shutdown: Callable[[], None] | None = None) -> ASGIApp:
    """The app; `on_shutdown` runs once the server stops serving (the command closes the state and engines)."""

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            await run_in_threadpool(on_shutdown)

    api = _Api(state)
    static = resources.files("quail.server") / "static"
    routes = [
        Route("/", lambda request: FileResponse(str(static / "index.html")), methods=["GET"]),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
        Route("/v1/health", api.health, methods=["GET"]),
        Route("/v1/info", api.info, methods=["GET"]),
        Route("/v1/tables", api.tables, methods=["GET"]),
        Route("/v1/backends", api.backends, methods=["GET"]),
        Route("/v1/compile", api.compile, methods=["POST"]),
        Route("/v1/explain", api.explain, methods=["POST"]),
        Route("/v1/queries", api.submit, methods=["POST"]),
        Route("/v1/queries", api.list_jobs, methods=["GET"]),
        Route("/v1/queries/{job_id}", api.status, methods=["GET"]),
        Route("/v1/queries/{job_id}/events", api.events, methods=["GET"]),
        Route("/v1/queries/{job_id}/result", api.result, methods=["GET"]),
        Route("/v1/queries/{job_id}/answers/{node:path}", api.answers, methods=["GET"]),
        Route("/v1/queries/{job_id}/cancel", api.cancel, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: _not_found, 405: _not_allowed, ApiError: _refused, _JobFailed: _refused,
                                        Exception: _internal})
    return _SecurityHeaders(_AccessCheck(app, state.settings.token, state.settings.host))


# -- the endpoints ------------------------------------------------------------------------------------


class _Api:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def health(self, request: Request) -> Response:
        return json_response({"status": "stopping" if self.state.stopping.is_set() else "ok"})

    async def info(self, request: Request) -> Response:
        session, scheduler = self.state.planning, self.state.scheduler
        return json_response({
            "model": session.model.name, "embedding_model": session.config.embedding_model,
            "backend": session.backend.name, "device": session.device.name, "compute": session.config.compute,
            "dialect": self.state.settings.dialect, "runs": scheduler.runs,
            "queued": sum(1 for job in scheduler.jobs() if job.state == "queued"),
            "max_request_bytes": self.state.settings.max_request_bytes,
            "max_result_bytes": self.state.settings.max_result_bytes,
        })

    async def tables(self, request: Request) -> Response:
        def listed() -> list[dict[str, object]]:
            with self.state.planning_lock:
                catalog = self.state.planning.catalog
            return [_table(schema.name, schema.columns, schema.id_column, schema.arrow)
                    for schema in sorted(catalog.values(), key=lambda s: s.name)]

        return await _answered(lambda: {"tables": listed()})

    async def backends(self, request: Request) -> Response:
        session = self.state.planning

        def listed() -> dict[str, object]:  # each backend's supports() may take a while: off the event loop
            rows = backend_statuses(session.registry, session.model, session.device, session.config.gpus)
            return {"model": session.model.name, "device": session.device.name, "backend": session.backend.name,
                    "backends": [{"name": r.name, "distribution": r.distribution, "status": r.status} for r in rows]}

        return await _answered(listed)

    async def compile(self, request: Request) -> Response:
        sql, dialect = await self._statement(request)
        return await _answered(lambda: self._compiled(sql, dialect) or {"ok": True})

    async def explain(self, request: Request) -> Response:
        sql, dialect = await self._statement(request)

        def explained() -> dict[str, object]:
            with self.state.planning_lock:
                return {"explain": self.state.planning.sql(sql, dialect=dialect).explain()}

        return await _answered(explained)

    async def submit(self, request: Request) -> Response:
        sql, dialect = await self._statement(request)
        if self.state.stopping.is_set():
            raise ApiError(503, "ShuttingDown", "the server is shutting down; no new query is taken")
        client = request.headers.get("x-quail-client") or (request.client.host if request.client else "unknown")

        def queued() -> dict[str, object]:
            self._compiled(sql, dialect)
            job = self.state.scheduler.submit(QueryJob(sql, dialect, client[:100]))
            return self._shown(job)

        return await _answered(queued, status=202)

    async def list_jobs(self, request: Request) -> Response:
        return json_response({"queries": [{"id": j.id, "state": j.state, "sql": j.sql, "submitted_at": j.submitted_at}
                                          for j in self.state.scheduler.jobs()]})

    async def status(self, request: Request) -> Response:
        return json_response(self._shown(self._job(request)))

    async def cancel(self, request: Request) -> Response:
        job = self._job(request)
        self.state.scheduler.cancel(job)
        return json_response(self._shown(job), status=202)

    async def events(self, request: Request) -> Response:
        job = self._job(request)
        return StreamingResponse(self._event_stream(job), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def result(self, request: Request) -> Response:
        job = self._job(request)
        table = self._finished(job).collect()
        form = request.query_params.get("format", "arrow")
        if form == "json":
            return json_response(await run_in_threadpool(_page, table, request.query_params))
        if form != "arrow":
            raise ApiError(400, "BadRequest", "format must be arrow (the default) or json")
        return Response(await run_in_threadpool(_arrow_bytes, table), media_type=ARROW_STREAM)

    async def answers(self, request: Request) -> Response:
        job = self._job(request)
        node = request.path_params["node"]
        tables = self._finished(job).answer_tables
        if node not in tables:
            raise ApiError(404, "NotFound", f"query {job.id} has no model node {node!r}; it has "
                                            f"{', '.join(sorted(tables)) or 'none'}")
        return Response(await run_in_threadpool(_arrow_bytes, tables[node]), media_type=ARROW_STREAM)

    # -- helpers --

    def _compiled(self, sql: str, dialect: Dialect) -> None:
        with self.state.planning_lock:
            self.state.planning.sql(sql, dialect=dialect)

    def _shown(self, job: QueryJob) -> dict[str, object]:
        body = job.snapshot()
        body["queue_position"] = self.state.scheduler.position(job)
        return body

    def _job(self, request: Request) -> QueryJob:
        job_id = request.path_params["job_id"]
        job = self.state.scheduler.job(job_id)
        if job is None:
            raise ApiError(404, "NotFound", f"no query {job_id!r} on this server (finished queries are kept for a "
                                            "while, then forgotten)")
        return job

    def _finished(self, job: QueryJob) -> QueryResult:
        if job.state == "failed" and job.error is not None:
            raise _JobFailed(job.error)
        if job.state == "cancelled":
            raise ApiError(409, "Cancelled", f"query {job.id} was cancelled; it has no result")
        if job.result is None:
            raise ApiError(409, "NotFinished", f"query {job.id} is {job.state}; its result is there once it has "
                                               "finished (watch /events)")
        return job.result

    async def _statement(self, request: Request) -> tuple[str, Dialect]:
        body = await read_json(request, self.state.settings.max_request_bytes)
        unknown = sorted(set(body) - {"sql", "dialect"})
        if unknown:
            raise ApiError(400, "BadRequest", f"unknown field(s) {', '.join(unknown)}: send sql and dialect")
        sql = body.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise ApiError(400, "BadRequest", "sql must be a non-empty string")
        dialect = body.get("dialect", self.state.settings.dialect)
        if dialect not in ("snowflake", "bigquery"):
            raise ApiError(400, "BadRequest", f"dialect {dialect!r}: choose snowflake or bigquery")
        return sql, dialect

    async def _event_stream(self, job: QueryJob) -> AsyncIterator[str]:
        """A snapshot whenever the job changed, then a last `done` event; comments keep idle proxies open."""
        sent, quiet = -1, 0.0
        while True:
            if job.version != sent:
                body = self._shown(job)
                sent = int(body["version"])  # type: ignore[call-overload]
                finished = body["state"] in DONE
                yield f"event: {'done' if finished else 'status'}\ndata: {_dumps(body)}\n\n"
                if finished:
                    return
                quiet = 0.0
            elif quiet >= KEEPALIVE_S:
                yield ": keep-alive\n\n"
                quiet = 0.0
            await asyncio.sleep(EVENT_POLL_S)
            quiet += EVENT_POLL_S


class _JobFailed(Exception):
    def __init__(self, body: ErrorBody) -> None:
        super().__init__(body.message)
        self.body = body


def _table(name: str, columns: tuple[str, ...], id_column: str | None, arrow: pa.Schema | None) -> dict[str, object]:
    types = {f.name: str(f.type) for f in arrow} if arrow is not None else {}
    return {"name": name, "id_column": id_column,
            "columns": [{"name": c, "type": types.get(c)} for c in columns]}


def _page(table: pa.Table, params: Mapping[str, str]) -> dict[str, object]:
    """A page of rows, each a list in column order (two columns may share a name)."""
    offset = _non_negative(params, "offset", 0)
    limit = min(_non_negative(params, "limit", JSON_PAGE_ROWS), MAX_JSON_PAGE_ROWS)
    part = table.slice(offset, limit)
    columns = [[_json_value(v) for v in column.to_pylist()] for column in part.columns]
    return {"columns": [{"name": f.name, "type": str(f.type)} for f in table.schema], "offset": offset,
            "total": table.num_rows, "rows": [list(row) for row in zip(*columns, strict=True)]}


def _json_value(value: object) -> object:
    """A cell as JSON says it unambiguously: bytes in base64, decimals as their exact text, dates and times in ISO
    8601, durations in seconds, a month-day-nanosecond interval as its three parts, maps as [key, value] pairs."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, pa.MonthDayNano):
        return {"months": value.months, "days": value.days, "nanoseconds": value.nanoseconds}
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return value


def _non_negative(params: Mapping[str, str], name: str, default: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()):
        raise ApiError(400, "BadRequest", f"{name} must be a whole number ≥ 0, got {text!r}")
    return int(text)


def _arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


async def read_json(request: Request, limit: int) -> dict[str, object]:
    """The body as a JSON object, refused (413) as soon as it is longer than `limit` — before it is read whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "TooLarge", f"the request body is {int(declared):,} bytes; this server takes at most "
                                        f"{limit:,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "TooLarge", f"the request body is over this server's {limit:,} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(400, "BadRequest", f"the body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body must be a JSON object such as {\"sql\": \"SELECT …\"}")
    return body


async def _answered(work: Callable[[], T], status: int = 200) -> Response:
    """`work` on a worker thread (it may tokenize, plan, read files), its result as JSON; its QuailError as the
    error it is."""
    try:
        value = await run_in_threadpool(work)
    except QuailError as error:
        return error_response(error_body(error))
    return json_response(value, status=status)


# -- JSON, errors, and the two middlewares --------------------------------------------------------------


def _finite(value: object) -> object:
    """JSON has no NaN or infinity: such a float is sent as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _dumps(value: object) -> str:
    return json.dumps(_finite(value), default=str, allow_nan=False, ensure_ascii=False)


def json_response(value: object, status: int = 200) -> Response:
    return Response(_dumps(value), status_code=status, media_type="application/json")


def error_response(body: ErrorBody) -> Response:
    return json_response({"error": body.as_dict()}, status=body.status)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError | _JobFailed)
    return error_response(exc.body)


async def _internal(request: Request, exc: Exception) -> Response:
    LOG.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(error_body(exc))


async def _not_found(request: Request, exc: Exception) -> Response:
    return error_response(ErrorBody("NotFound", f"no such path: {request.url.path}", 404))


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(ErrorBody("MethodNotAllowed", f"{request.method} is not allowed on {request.url.path}",
                                    405))


class _AccessCheck:
    """Who may call, checked before any endpoint runs.

    With a token, every /v1 path but health asks for `Authorization: Bearer <token>`, compared in constant time.
    Without one (a loopback server), a request must be addressed to a loopback name or the bound address (its
    `Host`): a web page elsewhere that rebinds its own name to 127.0.0.1 is refused, so it cannot read the tables.
    A POST must say `Content-Type: application/json`, which a browser sends across origins only after a preflight
    this server never grants: another site cannot submit a query in the user's name."""

    LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

    def __init__(self, app: ASGIApp, token: str | None, host: str) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None
        self.hosts = self.LOOPBACK_NAMES | {host.strip("[]").lower()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self._refusal(scope)
        if refused is None:
            await self.app(scope, receive, send)
            return
        response = error_response(refused)
        if refused.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)

    def _refusal(self, scope: Scope) -> ErrorBody | None:
        headers = {name: value for name, value in scope["headers"]}
        path = scope["path"]
        if self.token is None and _host_name(headers.get(b"host", b"")) not in self.hosts:
            return ErrorBody("Forbidden", "a server without a token answers requests addressed to a loopback name "
                             "only (start it with --token to be reached by another name)", 403)
        if self.token is not None and path.startswith("/v1/") and path not in OPEN_PATHS:
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.token):
                return ErrorBody("Unauthorized", "a valid token is needed: send the header 'Authorization: Bearer "
                                 "<token>' (quail serve printed it)", 401)
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if scope["method"] == "POST" and path.startswith("/v1/") and kind != b"application/json":
            return ErrorBody("UnsupportedMediaType", "send the body as JSON with 'Content-Type: application/json'",
                             415)
        return None


def _host_name(header: bytes) -> str:
    """The name in a Host header, without its port ('[::1]:8470' → '::1')."""
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


class _SecurityHeaders:
    """The page loads nothing from elsewhere and is framed by nobody; responses are not sniffed."""

    HEADERS = ((b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'"),
               (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))  # type: ignore[call-overload]
                message["headers"] = headers + [h for h in self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)

