"""The session's embedded DuckDB: registered tables as relations, scan views, the relational tail.

Everything relational in Quail runs here, written as SQL by sqlglot: the column predicates pushed to a
table's scan (a `ScanView` per alias), the checks that bind a query before any model work, and the
relational tail over the model's answers. Registered tables are re-read when their files change.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import duckdb
import pyarrow as pa

from quail.data.providers import FileStamp, TableSchema
from quail.data.scan import ScanView
from quail.data.scratch import ScratchDirectory
from quail.data.sources import Source, literal, quoted
from quail.errors import CompileError, QuailError
from quail.interrupts import Cancelled, Terminated

VIEW_BATCH_ROWS = 65_536
INTERRUPT_WAIT_S = 10.0
"""How long an interrupted DuckDB call may take to stop before the interruption is raised regardless."""
Result = TypeVar("Result")
_CONTEXT = re.compile(r"\n\s*\nLINE \d+:.*", re.DOTALL)


def duck_message(error: duckdb.Error) -> str:
    """DuckDB's message without the echo of the (rewritten) SQL text, which is not what the user wrote."""
    text = _CONTEXT.sub("", str(error)).strip()
    return re.sub(r"\s*\n\s*", " ", text)


_KEYBOARD_INTERRUPT = re.compile(r"failed: KeyboardInterrupt\b|^KeyboardInterrupt$", re.MULTILINE)
_TERMINATED = re.compile(r"\bTerminated: terminated by signal (\d+)")


@contextmanager
def translated(prefix: str = "") -> Iterator[None]:
    """DuckDB's errors as a CompileError naming the problem; Ctrl-C during a DuckDB call (which DuckDB
    turns into an interruption of its query) as the KeyboardInterrupt it was.

    A signal can also land while DuckDB runs Python code — reading a registered Arrow object — and
    DuckDB reports the exception raised there as an input error: that one is the interruption too.
    """
    try:
        yield
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None
    except duckdb.PermissionException as error:
        raise CompileError(f"{prefix}{duck_message(error)}; the relational part reads only the registered "
                           "tables: register the file (Session.register, --table), or allow every file with "
                           "EngineConfig(external_access=True) (--external-access)") from None
    except duckdb.Error as error:
        raise _interruption(str(error)) or CompileError(f"{prefix}{duck_message(error)}") from None
    except RuntimeError as error:
        if "interrupted" in str(error).lower():
            raise KeyboardInterrupt from None
        raise


def _interruption(text: str) -> BaseException | None:
    """The KeyboardInterrupt or `Terminated` that a DuckDB error carries from Python code it called."""
    if _KEYBOARD_INTERRUPT.search(text):
        return KeyboardInterrupt()
    terminated = _TERMINATED.search(text)
    return Terminated(int(terminated.group(1))) if terminated else None


@dataclass
class _Registered:
    source: Source
    stamp: tuple[FileStamp, ...]
    schema: TableSchema
    broken: CompileError | None = None
    """Why the table's files, changed since they were read, cannot be read now: raised for a query that reads
    this table, never for one that does not (read again once they change)."""


class Database:
    """One in-memory DuckDB connection per session; `close()` removes the view files it wrote.

    Sandboxed unless `external_access`: the connection may open only the files of registered tables
    (DuckDB's `allowed_paths` / `allowed_directories`), installs no extension and its settings are locked,
    so a query's SQL cannot read, write or attach anything else. DuckDB fixes the allowed paths when the
    sandbox closes, so registering a file not yet allowed opens a new connection and binds every table on it.
    """

    def __init__(self, external_access: bool = False) -> None:
        self.external_access = external_access
        self._allowed: frozenset[str] = frozenset()
        self._held = [_connect(external_access, self._allowed)]
        self._tables: dict[str, _Registered] = {}
        self._generation = 0
        self._views: dict[tuple[str, int], ScanView] = {}
        self._directories: list[ScratchDirectory] = []
        self._finalizer = weakref.finalize(self, _remove, self._held, self._directories)
        self._stopped = False

    @property
    def _connection(self) -> duckdb.DuckDBPyConnection:
        return self._held[0]

    def _allow(self, source: Source) -> None:
        """Make the files `source` reads openable: a new sandboxed connection with every table bound again."""
        wanted = frozenset(source.paths())
        if self.external_access or wanted <= self._allowed:
            return
        allowed = self._allowed | wanted
        connection = _connect(False, allowed)
        try:
            for name, table in self._tables.items():
                try:
                    with translated(f"cannot read {table.source.origin} as table {name!r}: "):
                        table.source.bind(connection, name)
                except (CompileError, OSError) as error:  # that table only: the others stay readable
                    table.broken = CompileError(f"table {name!r} cannot be read now: {error}")
                    table.stamp = ()
        except BaseException:
            connection.close()
            raise
        previous, self._held[0] = self._held[0], connection
        self._allowed = allowed
        previous.close()

    # -- registered tables ---------------------------------------------------------------------

    def register(self, name: str, source: Source) -> TableSchema:
        """Bind `source` under `name` (replacing an earlier one), check its ids, return its schema."""
        self._check_open()
        if name in self._tables:
            self._unbind(name)
        schema = self._bind(name, source)
        self._tables[name] = _Registered(source, source.stamp(), schema)
        self._generation += 1
        return schema

    @property
    def catalog(self) -> dict[str, TableSchema]:
        return {name: table.schema for name, table in self._tables.items()}

    def schema(self, name: str) -> TableSchema | None:
        """The table's columns; CompileError when its files changed and no longer read."""
        table = self._tables.get(name)
        if table is not None and table.broken is not None:
            raise table.broken
        return None if table is None else table.schema

    @property
    def generation(self) -> int:
        """Changes whenever a table is registered or read again because its files changed."""
        return self._generation

    def refresh(self) -> None:
        """Read again every table whose files changed since they were read; refuse one that no longer validates."""
        for name, table in self._tables.items():
            try:
                stamp = table.source.stamp()
                if stamp == table.stamp:
                    continue
                schema = self._bind(name, table.source)
            except (CompileError, OSError) as error:
                if table.broken is None:
                    self._generation += 1
                table.broken = CompileError(f"table {name!r}: its file changed since register and cannot be read "
                                            f"now: {table.source.origin}: {error}")
                continue
            table.stamp, table.schema, table.broken = stamp, schema, None
            self._generation += 1

    def _bind(self, name: str, source: Source) -> TableSchema:
        self._allow(source)
        with translated(f"cannot read {source.origin} as table {name!r}: "):
            source.bind(self._connection, name)
            arrow = self._connection.sql(f"SELECT * FROM {quoted(name)} LIMIT 0").to_arrow_table().schema
            if source.id_column is not None and not source.validates_ids:
                self._check_ids(name, source.id_column, arrow)
        return TableSchema(name, tuple(arrow.names), source.id_column, arrow)

    def _unbind(self, name: str) -> None:
        with translated():
            self._connection.execute(f"DROP VIEW IF EXISTS {quoted(name)}")
        try:
            self._connection.unregister(name)
        except duckdb.InterruptException:
            raise KeyboardInterrupt from None
        except duckdb.Error:
            pass  # a file's view was dropped above; there was no registered object to forget

    def _check_ids(self, name: str, id_column: str, arrow: pa.Schema) -> None:
        """Ids are non-null and unique, like a DocumentProvider's."""
        if id_column not in arrow.names:
            raise CompileError(f"table {name!r}: id column {id_column!r} is missing; columns are {list(arrow.names)}")
        table, column = quoted(name), quoted(id_column)
        counts = f"SELECT count(*), count(*) - count({column}), count(DISTINCT {column}) FROM {table}"
        rows, nulls, distinct = self._interruptible(lambda: self._connection.execute(counts).fetchall())[0]
        if nulls:
            raise CompileError(f"table {name!r}: id column {id_column!r} has {nulls} null value(s)")
        if distinct != rows:
            value, count = self._connection.execute(
                f"SELECT {column}, count(*) AS n FROM {table} GROUP BY ALL HAVING n > 1 ORDER BY n DESC, 1 "
                f"LIMIT 1").fetchall()[0]
            raise CompileError(f"table {name!r}: id column {id_column!r} repeats the value {value!r} ({count} rows)")

    # -- relations of a query ------------------------------------------------------------------

    def describe(self, sql: str) -> pa.Schema:
        """The columns a query would return, bound but not run; CompileError with DuckDB's reason."""
        self._check_open()
        with translated():
            return self._connection.sql(f"SELECT * FROM ({sql}) LIMIT 0").to_arrow_table().schema

    def check(self, sql: str, relations: Mapping[str, pa.Schema]) -> pa.Schema:
        """Bind `sql` over empty relations of these schemas: errors of names and types, before any model work."""
        with self._relations({name: schema.empty_table() for name, schema in relations.items()}):
            return self.describe(sql)

    def view(self, sql: str) -> ScanView:
        """The rows of a scan query, written once to a memory-mapped Arrow file (cached until a table changes)."""
        self._check_open()
        key = (sql, self._generation)
        cached = self._views.get(key)
        if cached is not None:
            return cached
        path = self._directory() / _view_name(sql)
        with translated("the scan failed: "):
            view = ScanView(self._interruptible(
                lambda: _mapped(self._connection.sql(sql).to_arrow_reader(VIEW_BATCH_ROWS), path)), sql)
        self._views[key] = view
        return view

    def run(self, sql: str, relations: Mapping[str, pa.Table]) -> pa.Table:
        """Run `sql` with these Arrow tables as named relations."""
        self._check_open()
        with self._relations(relations), translated("the relational part failed: "):
            return self._interruptible(lambda: self._connection.sql(sql).to_arrow_table())

    def _interruptible(self, work: Callable[[], Result]) -> Result:
        """`work` (DuckDB calls) on a thread of its own while this one waits, so that Ctrl-C and SIGTERM stop it.

        Python runs its signal handlers on the main thread, between bytecodes; a thread blocked inside a
        DuckDB call never gets there, and a query that never ends would ignore every signal. Waiting here
        instead, the handler runs, and the interruption it raises asks DuckDB to stop (`interrupt()`),
        waits for the call to end and goes on up — KeyboardInterrupt or `Terminated`, whichever it was.
        """
        if self._stopped:
            raise Cancelled()
        if threading.current_thread() is not threading.main_thread():
            return work()
        outcome: dict[str, object] = {}
        finished = threading.Event()  # not Thread.join: an interrupted join marks a running thread stopped

        def target() -> None:
            try:
                outcome["value"] = work()
            except BaseException as error:  # handed to the waiting thread, which raises it
                outcome["error"] = error
            finally:
                finished.set()

        threading.Thread(target=target, name="quail-duckdb", daemon=True).start()
        try:
            while not finished.wait(0.1):
                pass
        except BaseException:
            self._connection.interrupt()
            finished.wait(INTERRUPT_WAIT_S)
            raise
        error = outcome.get("error")
        if isinstance(error, BaseException):
            raise error
        return outcome["value"]  # type: ignore[return-value]

    @contextmanager
    def registered(self, relations: Mapping[str, pa.Table]) -> Iterator[None]:
        """These Arrow tables readable by name while inside (a statement's lookups, for its later rounds)."""
        self._check_open()
        with self._relations(relations):
            yield

    @contextmanager
    def _relations(self, relations: Mapping[str, pa.Table]) -> Iterator[None]:
        with translated():
            for name, table in relations.items():
                self._connection.register(name, table)
        try:
            yield
        finally:
            with translated():
                for name in relations:
                    self._connection.unregister(name)

    # -- lifetime ------------------------------------------------------------------------------

    def _directory(self) -> Path:
        if not self._directories:
            self._directories.append(ScratchDirectory("views"))
        return self._directories[0].path

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise QuailError("the session is closed")

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def interrupt(self) -> None:
        """Stop the DuckDB statement running now (on another thread: it raises, its caller unwinds) and refuse every
        later statement (`Cancelled`) until `resume()`: a cancelled query stops at its next statement too, which a
        DuckDB interrupt alone would not do (DuckDB forgets one that arrives between statements)."""
        self._stopped = True
        if self._finalizer.alive:
            self._connection.interrupt()

    def resume(self) -> None:
        """Statements run again after an `interrupt()` (the next query of the session)."""
        self._stopped = False

    def close(self) -> None:
        """Close the connection and remove the view files; safe to call twice."""
        self._views.clear()
        self._finalizer()


def _view_name(sql: str) -> str:
    return f"view-{hashlib.blake2b(sql.encode(), digest_size=8).hexdigest()}-{uuid.uuid4().hex[:8]}.arrow"


def _mapped(reader: pa.RecordBatchReader, path: Path) -> pa.Table:
    """Batch by batch into an Arrow file, then mapped: memory does not grow with the rows kept."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch)
    with pa.memory_map(str(path), "r") as source:
        return pa.ipc.open_file(source).read_all()


def _connect(external_access: bool, allowed: frozenset[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that never installs an extension; sandboxed to `allowed` unless `external_access`."""
    connection = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False})
    if external_access:
        return connection
    files = sorted(path for path in allowed if not path.endswith("/"))
    directories = sorted(path for path in allowed if path.endswith("/"))
    try:
        connection.execute(f"SET allowed_paths = [{', '.join(literal(p) for p in files)}]")
        connection.execute(f"SET allowed_directories = [{', '.join(literal(p) for p in directories)}]")
        connection.execute("SET enable_external_access = false")
        connection.execute("SET lock_configuration = true")
    except BaseException:
        connection.close()
        raise
    return connection


def _remove(held: list[duckdb.DuckDBPyConnection], directories: list[ScratchDirectory]) -> None:
    try:
        held[0].close()
    finally:
        for directory in directories:
            directory.remove()
