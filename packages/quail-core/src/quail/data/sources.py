"""What `Session.register` accepts, each made into a relation the session's DuckDB reads.

Data in memory (a pyarrow Table, RecordBatch, RecordBatchReader or Dataset, a pandas or polars
DataFrame, a DuckDB relation, a DocumentProvider) is scanned in place by DuckDB; files are read by
DuckDB's own readers (Parquet, CSV, newline-delimited JSON, a table of a DuckDB database file) with
projection and filter pushdown, Arrow IPC files through a pyarrow dataset. Every source has a stamp
that changes when its files change on disk, so the session notices and reads them again.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
from sqlglot import exp
from sqlglot.errors import SqlglotError

from quail.data.providers import DocumentProvider, FileSource, FileStamp, dataset_files, file_stamps

Reader = Literal["parquet", "csv", "json", "ipc", "duckdb"]
SUFFIXES: dict[str, Reader] = {
    ".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json",
    ".ndjson": "json", ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc", ".duckdb": "duckdb", ".db": "duckdb",
}
DUCKDB_READERS = {"parquet": "read_parquet", "csv": "read_csv", "json": "read_json"}
_ATTACHED = itertools.count()


@runtime_checkable
class Source(Protocol):
    """A registered table: where its rows come from, and how DuckDB reads them under a name."""

    @property
    def id_column(self) -> str | None: ...

    @property
    def origin(self) -> str:
        """What the user registered, for messages (a path, or the kind of object)."""
        ...

    @property
    def validates_ids(self) -> bool:
        """True when the source checks its own id column (a DocumentProvider); else the session does."""
        ...

    def bind(self, connection: duckdb.DuckDBPyConnection, name: str) -> None:
        """Make `name` a relation of `connection` that reads this source as it is now."""
        ...

    def stamp(self) -> tuple[FileStamp, ...]:
        """Changes when the data changes on disk; empty for data in memory, which cannot change."""
        ...

    def paths(self) -> tuple[str, ...]:
        """The files and directories (a trailing `/`) DuckDB itself opens to read this source; none for data
        that reaches DuckDB as Arrow. The sandboxed relational part may open these and nothing else."""
        ...


def quoted(name: str) -> str:
    """An identifier as DuckDB SQL."""
    return exp.to_identifier(name, quoted=True).sql("duckdb")


def literal(text: str) -> str:
    return exp.Literal.string(text).sql("duckdb")


def literal_path(path: str) -> str:
    """A path as DuckDB's readers take it, naming that one file: they expand `*`, `?` and `[...]` as a glob,
    so each is written as a one-character class (`[[]`) that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


@dataclass(frozen=True)
class ArrowSource:
    """Arrow data in memory, or a pyarrow dataset (read again when its local files change)."""

    data: pa.Table | ds.Dataset
    id_column: str | None = None
    origin: str = "a pyarrow table"
    files: FileSource | None = field(default=None, compare=False)
    validates_ids: bool = False

    def bind(self, connection: duckdb.DuckDBPyConnection, name: str) -> None:
        data = self.files.reopen() if self.files is not None else self.data
        connection.register(name, data)

    def stamp(self) -> tuple[FileStamp, ...]:
        return file_stamps(self.files.listing()) if self.files is not None else ()

    def paths(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class ProviderSource:
    """A DocumentProvider: it validates its ids itself, and re-reads its files when they change."""

    provider: DocumentProvider
    validates_ids: bool = True

    @property
    def id_column(self) -> str | None:
        return self.provider.id_column

    @property
    def origin(self) -> str:
        return ", ".join(stamp.path for stamp in self.provider.stamp) or "a DocumentProvider"

    def bind(self, connection: duckdb.DuckDBPyConnection, name: str) -> None:
        connection.register(name, self.provider.dataset)

    def stamp(self) -> tuple[FileStamp, ...]:
        self.provider.refresh()
        return self.provider.stamp

    def paths(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class DuckFileSource:
    """A Parquet, CSV or JSON file (or a directory of Parquet files), read by DuckDB's own reader."""

    path: Path
    reader: Literal["parquet", "csv", "json"]
    id_column: str | None = None
    validates_ids: bool = False

    @property
    def origin(self) -> str:
        return str(self.path)

    def files(self) -> list[str]:
        """Absolute paths: the sandboxed relational part compares them with the paths it may open."""
        path = self.path.absolute()
        if path.is_dir():
            return sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
        return [str(path)]

    def bind(self, connection: duckdb.DuckDBPyConnection, name: str) -> None:
        files = ", ".join(literal(literal_path(f)) for f in self.files())
        reader = DUCKDB_READERS[self.reader]
        connection.execute(f"CREATE OR REPLACE TEMP VIEW {quoted(name)} AS SELECT * FROM {reader}([{files}])")

    def stamp(self) -> tuple[FileStamp, ...]:
        return file_stamps(self.files())

    def paths(self) -> tuple[str, ...]:
        if self.path.is_dir():
            directory = str(self.path.absolute())
            return (f"{directory}/", f"{literal_path(directory)}/")
        return tuple(path for f in self.files() for path in (f, literal_path(f)))


@dataclass(frozen=True)
class DuckTableSource:
    """A table of a DuckDB database file, attached read-only."""

    path: Path
    table: str
    id_column: str | None = None
    validates_ids: bool = False

    @property
    def origin(self) -> str:
        return f"{self.path}:{self.table}"

    def bind(self, connection: duckdb.DuckDBPyConnection, name: str) -> None:
        database = f"__quail_db_{next(_ATTACHED)}"
        connection.execute(f"ATTACH {literal(str(self.path.absolute()))} AS {quoted(database)} (READ_ONLY)")
        table = table_name(self.table, self.path)
        target = ".".join(quoted(part.name) for part in (table.args.get("db"), table.this) if part is not None)
        connection.execute(f"CREATE OR REPLACE TEMP VIEW {quoted(name)} AS SELECT * FROM {quoted(database)}.{target}")

    def stamp(self) -> tuple[FileStamp, ...]:
        return file_stamps([str(self.path)])

    def paths(self) -> tuple[str, ...]:
        """The database file and its write-ahead log (DuckDB looks for one even when attaching read-only)."""
        path = self.path.absolute()
        return (str(path), f"{path}.wal")


def table_name(text: str, path: Path) -> exp.Table:
    """`table` or `schema.table` of a DuckDB database; ValueError naming it when it is anything else."""
    try:
        table = exp.to_table(text, dialect="duckdb")
    except SqlglotError as error:
        raise ValueError(f"{text!r} is not a table name of {path} ({error.__class__.__name__}: it does not parse "
                         "as [schema.]table)") from None
    if not isinstance(table.this, exp.Identifier) or table.args.get("catalog") is not None:
        raise ValueError(f"{text!r} is not a table name of {path}: write table or schema.table")
    return table


ACCEPTED = ("a DocumentProvider, a pyarrow Table / RecordBatch / RecordBatchReader / Dataset, a pandas or polars "
            "DataFrame, a DuckDB relation, or the path of a Parquet, CSV, JSON, Arrow or DuckDB file")


def as_source(data: object, id_column: str | None = None, table: str | None = None) -> Source:
    """The source for what a user registers; `table` names the table of a DuckDB database file."""
    if isinstance(data, DocumentProvider):
        return ProviderSource(data)
    if isinstance(data, str | os.PathLike):
        return file_source(Path(data), id_column, table)
    arrow = _arrow_of(data)
    if arrow is None:
        raise TypeError(f"register() takes {ACCEPTED}; got {type(data).__name__}")
    files = dataset_files(arrow) if isinstance(arrow, ds.Dataset) else None
    return ArrowSource(arrow, id_column, f"a {type(data).__name__}", files)


def file_source(path: Path, id_column: str | None, table: str | None = None) -> Source:
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {str(path)!r}")
    reader: Reader | None = "parquet" if path.is_dir() else SUFFIXES.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"cannot read {path.suffix or 'a file without a suffix'} files ({path}); use one of "
                         f"{', '.join(sorted(SUFFIXES))}")
    if reader == "duckdb":
        if not table:
            raise ValueError(f"{path} is a DuckDB database: name its table (path:table)")
        table_name(table, path)
        return DuckTableSource(path, table, id_column)
    if table:
        raise ValueError(f"{path} is not a DuckDB database; only those take a table name")
    if reader == "ipc":
        dataset = ds.dataset(str(path), format="ipc")
        return ArrowSource(dataset, id_column, str(path), dataset_files(dataset))
    return DuckFileSource(path, reader, id_column)


def _arrow_of(data: object) -> pa.Table | ds.Dataset | None:
    """Arrow data for an object held in memory, or None when it is no kind we read."""
    if isinstance(data, pa.Table | ds.Dataset):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if isinstance(data, duckdb.DuckDBPyRelation):
        return data.to_arrow_table()
    module = type(data).__module__.split(".")[0]
    if module == "pandas" and type(data).__name__ == "DataFrame":
        return pa.Table.from_pandas(data, preserve_index=False)
    if module == "polars" and type(data).__name__ == "DataFrame":
        table = data.to_arrow()
        return table if isinstance(table, pa.Table) else None
    return None
