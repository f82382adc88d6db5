"""`quail.connect(url, token=...)`: a session on a `quail serve` elsewhere, with the objects a local session gives.

    with quail.connect("http://gpu-box:8470", token="...") as s:
        q = s.sql("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is this review positive? {0}', r.body))")
        print(q.explain())
        res = q.run()            # a QueryResult: collect(), to_pandas(), report, explain(), answer_tables
        res.collect()

Errors arrive as the exceptions a local session raises (CompileError with its line and column, RefusalError
with its refusal). Only the standard library speaks HTTP here; rows come as Arrow IPC, everything else as JSON.
Ctrl-C during `run()` cancels the query on the server before it goes on up.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import cast

import pyarrow as pa

from quail.errors import (
    CompileError,
    ComputeError,
    ConfigError,
    ModelFileError,
    PlanEditError,
    QuailError,
    QueryCancelledError,
    Refusal,
    RefusalError,
    ServerError,
    UsageError,
    WorkerLostError,
)
from quail.frontend.sql import Dialect
from quail.runtime.report import ReportValue
from quail.runtime.results import QueryResult, ReceivedReport

RemoteProgress = Callable[[str, str, int, int], None]
"""(node id, node description, items done, items in total), as the server's backend reports them."""
JsonObject = dict[str, object]
PLAIN_ERRORS: dict[str, type[QuailError]] = {kind.__name__: kind for kind in (
    ConfigError, UsageError, ModelFileError, PlanEditError, QuailError, ComputeError, WorkerLostError)}
"""The error kinds a server sends with only a message, each raised here as itself (the compute errors come with a
5xx status: the server's workers failed, not the request)."""
STREAM_TIMEOUT_S = 60.0
"""The longest wait for a line of an event stream: the server writes at least every 15 s while a query runs."""


def connect(url: str, token: str | None = None, *, client: str | None = None,
            timeout_s: float = 60.0) -> RemoteSession:
    """A session on the server at `url` (checked at once: a server that does not answer is a ServerError)."""
    session = RemoteSession(url, token, client=client, timeout_s=timeout_s)
    session.info()
    return session


@dataclass(frozen=True)
class _Http:
    url: str
    token: str | None
    client: str | None
    timeout_s: float

    def request(self, method: str, path: str, body: JsonObject | None = None) -> urllib.request.Request:
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.client is not None:
            headers["X-Quail-Client"] = self.client
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        return urllib.request.Request(self.url + path, data=data, headers=headers, method=method)

    def open(self, method: str, path: str, body: JsonObject | None = None,
             timeout_s: float | None = None) -> http.client.HTTPResponse:
        try:
            response: http.client.HTTPResponse = urllib.request.urlopen(
                self.request(method, path, body), timeout=self.timeout_s if timeout_s is None else timeout_s)
            return response
        except urllib.error.HTTPError as error:
            raise _raised(error.code, error.read()) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ServerError(f"cannot reach the Quail server at {self.url}: {reason}") from None

    def json(self, method: str, path: str, body: JsonObject | None = None) -> JsonObject:
        with self.open(method, path, body) as response:
            value = json.loads(response.read())
        if not isinstance(value, dict):
            raise ServerError(f"{self.url}{path} answered {type(value).__name__}, not a JSON object")
        return value

    def arrow(self, path: str) -> pa.Table:
        with self.open("GET", path) as response:
            return pa.ipc.open_stream(response.read()).read_all()


def _raised(status: int, raw: bytes) -> QuailError:
    """The exception an error response's body stands for."""
    try:
        error = json.loads(raw)["error"]
        if not isinstance(error, dict):
            raise TypeError(error)
        return _error_of(status, error)
    except (ValueError, KeyError, TypeError):
        return ServerError(f"the server answered HTTP {status}: {raw[:200].decode(errors='replace')}")


def _error_of(status: int, error: dict[str, object]) -> QuailError:
    """The exception a server's error object (`{"kind", "message", ...}`) stands for; KeyError without those two."""
    kind, message = str(error["kind"]), str(error["message"])
    if kind == "CompileError":
        line, column = error.get("line"), error.get("column")
        return CompileError(str(error.get("detail") or message), line=line if isinstance(line, int) else None,
                            column=column if isinstance(column, int) else None)
    parts = error.get("refusal")
    if kind == "RefusalError" and isinstance(parts, dict):
        return RefusalError(Refusal(str(parts.get("constraint", message)), tuple(parts.get("reasons") or ()),
                                    parts.get("needed"), parts.get("available"), parts.get("unit"),
                                    tuple(parts.get("hints") or ())))
    if kind == "Cancelled":
        return QueryCancelledError(message)
    if status < 500 or kind in ("ComputeError", "WorkerLostError"):
        return PLAIN_ERRORS.get(kind, QuailError)(message)
    return ServerError(f"the server failed ({kind}, HTTP {status}): {message}")


class RemoteSession:
    """The server's tables and engine, used like `quail.Session` (registering tables is the server's business)."""

    def __init__(self, url: str, token: str | None = None, *, client: str | None = None,
                 timeout_s: float = 60.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise QuailError(f"{url!r} is not a server address: write http://host:port")
        self._http = _Http(f"{parsed.scheme}://{parsed.netloc}", token, client, timeout_s)
        self.closed = False

    @property
    def url(self) -> str:
        return self._http.url

    def info(self) -> JsonObject:
        """The server's model, backend, device, compute, and how many queries it ran and holds."""
        return self._http.json("GET", "/v1/info")

    def tables(self) -> dict[str, list[str]]:
        """Each registered table's columns."""
        listed = self._http.json("GET", "/v1/tables")["tables"]
        assert isinstance(listed, list)
        return {t["name"]: [c["name"] for c in t["columns"]] for t in listed}

    def backends(self) -> list[JsonObject]:
        rows = self._http.json("GET", "/v1/backends")["backends"]
        assert isinstance(rows, list)
        return rows

    def sql(self, text: str, dialect: Dialect = "snowflake") -> RemoteQuery:
        """The statement, compiled by the server now: a CompileError or RefusalError is raised here, as locally."""
        self._check_open()
        self._http.json("POST", "/v1/compile", {"sql": text, "dialect": dialect})
        return RemoteQuery(self._http, text, dialect)

    def _check_open(self) -> None:
        if self.closed:
            raise QuailError("this connection is closed: quail.connect(...) again")

    def close(self) -> None:
        """Nothing is held open between requests; a closed session takes no more queries."""
        self.closed = True

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class RemoteQuery:
    """A compiled statement on the server: `explain()`, `run()`, `collect()` as a local Query has them."""

    def __init__(self, http: _Http, text: str, dialect: Dialect) -> None:
        self._http = http
        self.text = text
        self.dialect = dialect
        self.job_id: str | None = None

    def explain(self) -> str:
        return str(self._http.json("POST", "/v1/explain", {"sql": self.text, "dialect": self.dialect})["explain"])

    def submit(self) -> str:
        """Queue the statement on the server; its query id (`run()` does this, then waits)."""
        job = self._http.json("POST", "/v1/queries", {"sql": self.text, "dialect": self.dialect})
        self.job_id = str(job["id"])
        return self.job_id

    def run(self, progress: RemoteProgress | None = None) -> QueryResult:
        """Run it on the server and wait for the rows; `progress` hears each model node's progress as it comes."""
        job_id = self.submit()
        try:
            final = self._follow(job_id, progress)
        except BaseException:  # Ctrl-C, a lost stream, a progress callback's error: the server stops the query too
            self._cancel_quietly()
            raise
        return self._result(job_id, final)

    def collect(self) -> pa.Table:
        return self.run().collect()

    def cancel(self) -> None:
        """Stop this query on the server (queued: it never runs; running: it stops at its next step)."""
        if self.job_id is not None:
            self._http.json("POST", f"/v1/queries/{self.job_id}/cancel", {})

    def _cancel_quietly(self) -> None:
        """`cancel`, on the way out of another error: its own failure (a server gone) must not hide that one."""
        with contextlib.suppress(QuailError):
            self.cancel()

    def _follow(self, job_id: str, progress: RemoteProgress | None) -> JsonObject:
        """Read the job's event stream until its `done` event; its last snapshot."""
        timeout_s = max(self._http.timeout_s, STREAM_TIMEOUT_S)
        with self._http.open("GET", f"/v1/queries/{job_id}/events", timeout_s=timeout_s) as stream:
            try:
                for event, data in _events(stream):
                    snapshot = json.loads(data)
                    if progress is not None:
                        for node in snapshot.get("progress", []):
                            progress(node["node"], node["description"], node["done"], node["total"])
                    if event == "done":
                        return snapshot
            except (OSError, http.client.HTTPException) as error:
                raise ServerError(f"the event stream of query {job_id} broke: {error or type(error).__name__}"
                                  ) from None
        raise ServerError(f"the server closed the event stream of query {job_id} before it finished")

    def _result(self, job_id: str, final: JsonObject) -> QueryResult:
        state = final["state"]
        if state == "cancelled":
            raise QueryCancelledError(f"query {job_id} was cancelled on the server")
        error = final.get("error")
        if state == "failed" and isinstance(error, dict):
            status = error.get("status")
            raise _error_of(status if isinstance(status, int) else 500, error)
        table = self._http.arrow(f"/v1/queries/{job_id}/result")
        report = final["report"]
        assert isinstance(report, dict)
        names = final.get("answers", [])
        assert isinstance(names, list)
        return QueryResult(table, _RemoteAnswers(self._http, job_id, tuple(names)),
                           ReceivedReport(cast(dict[str, ReportValue], report)),  # JSON values are ReportValues
                           str(final.get("explain", "")))


def _events(stream: http.client.HTTPResponse) -> Iterator[tuple[str, str]]:
    """(event, data) of a text/event-stream, one per blank-line-ended block; comments skipped."""
    event, data = "message", []
    for raw in stream:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


class _RemoteAnswers(Mapping[str, pa.Table]):
    """A finished query's answer tables, each fetched from the server when first read."""

    def __init__(self, http: _Http, job_id: str, names: tuple[str, ...]) -> None:
        self._http, self._job_id, self._names = http, job_id, names
        self._fetched: dict[str, pa.Table] = {}

    def __getitem__(self, name: str) -> pa.Table:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._fetched:
            quoted = urllib.parse.quote(name, safe="")
            self._fetched[name] = self._http.arrow(f"/v1/queries/{self._job_id}/answers/{quoted}")
        return self._fetched[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
