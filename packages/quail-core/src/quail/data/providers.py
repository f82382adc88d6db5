"""Document providers: tables of text documents, each with a validated id column.

A provider wraps a `pyarrow.dataset.Dataset`, so a Parquet file larger than memory is read in bounded
batches of only the columns a query needs. Rows are addressed by their int32 position in the provider's
scan order, which is stable: batches are read single-threaded, file by file.

A provider over files notices when they change on disk (size, modification time and a hash of each
file's first and last 64 KiB): it re-reads and re-validates them, or refuses with "file changed since
register" when they no longer hold a valid table, so no answer mixes old tokens with new text.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.fs
import pyarrow.json as pa_json

from quail.errors import CompileError

Columns = Sequence[str] | str | None
Rows = pa.Array | pa.ChunkedArray | Sequence[int]

MAX_ROWS = 2**31 - 1
"""Rows are addressed by int32 positions."""

DEFAULT_BATCH_ROWS = 65_536
_ID_BATCH_ROWS = 65_536
_HASH_WINDOW_ROWS = 65_536
_TABLE_BATCH_ROWS = 1 << 20
_SAMPLE_BYTES = 1 << 16


@dataclass(frozen=True)
class TableSchema:
    """What the compiler needs of a registered table: its columns and which one is the id (if any).

    `arrow` carries the column types when known, so the relational part can be checked before a run.
    """

    name: str
    columns: tuple[str, ...]
    id_column: str | None
    arrow: pa.Schema | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class FileStamp:
    """What changes when a file is rewritten: size, modification time, a hash of its first and last bytes."""

    path: str
    size: int
    mtime_ns: int
    sample: str

    @classmethod
    def of(cls, path: str) -> FileStamp:
        stat = os.stat(path)
        digest = hashlib.blake2b(digest_size=16)
        with open(path, "rb") as handle:
            digest.update(handle.read(_SAMPLE_BYTES))
            if stat.st_size > _SAMPLE_BYTES:
                handle.seek(max(stat.st_size - _SAMPLE_BYTES, _SAMPLE_BYTES))
                digest.update(handle.read(_SAMPLE_BYTES))
        return cls(path, stat.st_size, stat.st_mtime_ns, digest.hexdigest())


def file_stamps(paths: Sequence[str]) -> tuple[FileStamp, ...]:
    """Stamps of files that exist; a missing file is a stamp of size -1, so its loss is a change too."""
    stamps = []
    for path in paths:
        try:
            stamps.append(FileStamp.of(path))
        except OSError:
            stamps.append(FileStamp(path, -1, -1, ""))
    return tuple(stamps)


Reopen = Callable[[], ds.Dataset]


class DocumentProvider:
    """A table of documents. The id column is mandatory: non-null and unique (checked at construction,
    and again whenever the files under it change)."""

    def __init__(self, dataset: ds.Dataset, id_column: str, *, files: FileSource | None = None) -> None:
        if not isinstance(dataset, ds.Dataset):
            raise TypeError(f"a DocumentProvider wraps a pyarrow.dataset.Dataset, got {type(dataset).__name__}")
        self._dataset = dataset
        self.id_column = id_column
        self._files = files or dataset_files(dataset)
        self._stamp = file_stamps(self._files.listing()) if self._files else ()
        self._num_rows = _validate_ids(dataset, id_column)
        self._identity: str | None = None

    # -- constructors --------------------------------------------------------------------------

    @classmethod
    def from_table(cls, table: pa.Table | pa.RecordBatch, id_col: str) -> DocumentProvider:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            raise TypeError(f"from_table takes a pyarrow.Table, got {type(table).__name__}")
        return cls(ds.dataset(table), id_col)

    @classmethod
    def from_dataset(cls, dataset: ds.Dataset, id_col: str) -> DocumentProvider:
        return cls(dataset, id_col)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike[str], id_col: str) -> DocumentProvider:
        """A Parquet file, or a directory of them read in path order."""
        return cls._from_files(path, "parquet", id_col)

    @classmethod
    def from_ipc(cls, path: str | os.PathLike[str], id_col: str) -> DocumentProvider:
        """An Arrow IPC file (Feather v2)."""
        return cls._from_files(path, "ipc", id_col)

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str], id_col: str) -> DocumentProvider:
        return cls._from_files(path, "csv", id_col)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], id_col: str) -> DocumentProvider:
        """Newline-delimited JSON: one object per line."""
        return cls._from_files(path, "json", id_col)

    @classmethod
    def _from_files(cls, path: str | os.PathLike[str], file_format: str, id_col: str) -> DocumentProvider:
        return cls(_file_dataset(path, file_format), id_col, files=_path_source(path, file_format))

    # -- description ---------------------------------------------------------------------------

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.dataset.schema.names)

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.dataset.schema

    @property
    def num_rows(self) -> int:
        self.refresh()
        return self._num_rows

    @property
    def dataset(self) -> ds.Dataset:
        """The current dataset (re-opened first if its files changed since it was read)."""
        self.refresh()
        return self._dataset

    def schema(self, name: str) -> TableSchema:
        schema = self.arrow_schema
        return TableSchema(name=name, columns=tuple(schema.names), id_column=self.id_column, arrow=schema)

    @property
    def identity(self) -> str:
        """Equal for equal content, different when it changes: keys cached work such as token files."""
        self.refresh()
        if self._identity is None:
            if isinstance(self._dataset, ds.FileSystemDataset):
                samples = "".join(stamp.sample for stamp in self._stamp)
                self._identity = f"files:{_files_digest(self._dataset)}:{samples}"
            else:
                self._identity = f"data:{content_digest(self._dataset)}"
        return self._identity

    def column_identity(self, column: str) -> str:
        """The provider's identity: its token files are keyed by the whole table (and the column)."""
        return self.identity

    @property
    def stamp(self) -> tuple[FileStamp, ...]:
        """The files under the provider as last read (empty for data in memory)."""
        return self._stamp

    def refresh(self) -> None:
        """Re-read and re-validate files that changed since they were read; refuse them if no longer valid."""
        if self._files is None:
            return
        stamp = file_stamps(self._files.listing())
        if stamp == self._stamp:
            return
        try:
            dataset = self._files.reopen()
            num_rows = _validate_ids(dataset, self.id_column)
        except (CompileError, OSError, pa.ArrowException) as error:
            where = ", ".join(s.path for s in stamp) or "its files"
            raise CompileError(f"file changed since register: {where}: {error}") from None
        self._dataset, self._num_rows, self._identity, self._stamp = dataset, num_rows, None, stamp

    def __repr__(self) -> str:
        return f"DocumentProvider(rows={self._num_rows}, columns={list(self.columns)}, id={self.id_column!r})"

    # -- reading -------------------------------------------------------------------------------

    def scan(self, columns: Columns = None, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Batches of at most `batch_rows` rows of only `columns`, in row order."""
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be positive, got {batch_rows}")
        names = self._checked(columns)
        return _batches(self._dataset, names, batch_rows)

    def take(self, rows: Rows, columns: Columns = None) -> pa.Table:
        """The rows at these positions, in the given order (repeats allowed): one scan that stops early."""
        names = self._checked(columns)
        positions = _positions(rows, self.num_rows)
        order = pc.sort_indices(positions)
        wanted = positions.take(order)
        picked = pa.Table.from_batches(list(_pick(self._dataset, names, wanted)), schema=self._projected(names))
        return picked.take(pc.sort_indices(order))

    def to_table(self, columns: Columns = None) -> pa.Table:
        names = self._checked(columns)
        batches = _batches(self._dataset, names, _TABLE_BATCH_ROWS)
        return pa.Table.from_batches(list(batches), schema=self._projected(names))

    def _checked(self, columns: Columns) -> list[str]:
        self.refresh()
        return checked_columns(columns, self.columns)

    def _projected(self, names: list[str]) -> pa.Schema:
        schema = self._dataset.schema
        return pa.schema([schema.field(name) for name in names])


def checked_columns(columns: Columns, available: Sequence[str]) -> list[str]:
    """The columns asked for (all when None), each once, in order; CompileError naming unknown ones."""
    if columns is None:
        return list(available)
    names = [columns] if isinstance(columns, str) else list(dict.fromkeys(columns))
    unknown = [name for name in names if name not in available]
    if unknown:
        raise CompileError(f"unknown column {', '.join(map(repr, unknown))}; columns are {list(available)}")
    return names


# -- scanning ----------------------------------------------------------------------------------


def _file_dataset(path: str | os.PathLike[str], file_format: str) -> ds.Dataset:
    location = Path(path)
    if not location.exists():
        raise FileNotFoundError(f"no such file or directory: {str(location)!r}")
    try:
        return ds.dataset(str(location), format=_text_format(file_format))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        reason = _first_line(error)
        if "straddl" in reason:
            reason = (f"a row of it is longer than {TEXT_BLOCK_BYTES >> 20} MiB, the most Quail reads as one CSV "
                      "record or JSON line")
        raise CompileError(f"cannot read {str(location)!r} as {file_format}: {reason}") from None


TEXT_BLOCK_BYTES = 64 << 20
"""Bytes pyarrow reads of a CSV or JSON file at a time: one record must fit. Its 1 MiB default refuses a long
document as a "straddling object", or — for a JSON line read for a few columns — reads its values as nulls."""


def _text_format(file_format: str) -> str | ds.FileFormat:
    """CSV and JSON read in blocks that hold a long document; other formats as pyarrow has them."""
    if file_format == "csv":
        return ds.CsvFileFormat(read_options=pa_csv.ReadOptions(block_size=TEXT_BLOCK_BYTES))
    if file_format == "json":
        return ds.JsonFileFormat(read_options=pa_json.ReadOptions(block_size=TEXT_BLOCK_BYTES))
    return file_format


def _first_line(error: BaseException) -> str:
    """pyarrow's message without its internal context lines."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _batches(dataset: ds.Dataset, names: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Single-threaded and sliced, so order is stable and no batch exceeds `batch_rows`."""
    scanner = dataset.scanner(columns=names, batch_size=batch_rows, use_threads=False, batch_readahead=1,
                              fragment_readahead=1, fragment_scan_options=_fragment_options(dataset))
    for batch in scanner.to_batches():
        for start in range(0, batch.num_rows, batch_rows):
            yield batch.slice(start, batch_rows)


@dataclass(frozen=True)
class FileSource:
    """How to list the files under a provider now, and how to read them again."""

    listing: Callable[[], list[str]]
    reopen: Reopen


def _path_source(path: str | os.PathLike[str], file_format: str) -> FileSource:
    location = Path(path)

    def listing() -> list[str]:
        if location.is_dir():
            return sorted(str(p) for p in location.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
        return [str(location)]

    return FileSource(listing, lambda: _file_dataset(path, file_format))


def dataset_files(dataset: ds.Dataset) -> FileSource | None:
    """The files of a local file dataset; None for data in memory, which cannot change."""
    if not isinstance(dataset, ds.FileSystemDataset) or not isinstance(dataset.filesystem, pa.fs.LocalFileSystem):
        return None
    files, file_format, filesystem = list(dataset.files), dataset.format, dataset.filesystem
    return FileSource(lambda: list(files), lambda: ds.dataset(files, format=file_format, filesystem=filesystem))


def _fragment_options(dataset: ds.Dataset) -> ds.FragmentScanOptions | None:
    """Parquet without pre-buffering: pre-buffering reads ahead across row groups, so memory grows with the file."""
    file_format = dataset.format if isinstance(dataset, ds.FileSystemDataset) else None
    if not isinstance(file_format, ds.ParquetFileFormat):
        return None
    options = pickle.loads(pickle.dumps(file_format.default_fragment_scan_options))  # a copy: keep the caller's
    options.pre_buffer = False
    return options


def _positions(rows: Rows, num_rows: int) -> pa.Int32Array:
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    array = rows if isinstance(rows, pa.Array) else pa.array(rows, type=pa.int32())
    if not pa.types.is_integer(array.type):
        raise TypeError(f"row positions must be integers, got {array.type}")
    if array.null_count:
        raise ValueError("row positions must not be null")
    if len(array):
        low, high = pc.min_max(array).values()
        for value in (low.as_py(), high.as_py()):
            if not 0 <= value < num_rows:
                raise IndexError(f"row {value} is out of range for a table of {num_rows} rows")
    return array.cast(pa.int32())


def _pick(dataset: ds.Dataset, names: list[str], wanted: pa.Int32Array) -> Iterator[pa.RecordBatch]:
    """The wanted rows (sorted positions) batch by batch; stops after the last one."""
    if not len(wanted):
        return
    starts = wanted.to_pylist()
    last = starts[-1]
    offset = 0
    for batch in _batches(dataset, names, DEFAULT_BATCH_ROWS):
        end = offset + batch.num_rows
        low, high = bisect_left(starts, offset), bisect_left(starts, end)
        if high > low:
            yield batch.take(pc.subtract(wanted.slice(low, high - low), pa.scalar(offset, pa.int32())))
        if end > last:
            return
        offset = end


# -- validation --------------------------------------------------------------------------------


def _validate_ids(dataset: ds.Dataset, id_column: str) -> int:
    """Reads only the id column, batch by batch; returns the row count."""
    names = dataset.schema.names
    if id_column not in names:
        raise CompileError(f"id column {id_column!r} is missing; columns are {list(names)}")
    kind = dataset.schema.field(id_column).type
    if pa.types.is_nested(kind) or pa.types.is_dictionary(kind):
        raise CompileError(f"id column {id_column!r} holds {kind}; ids are numbers or text, one per row")
    chunks: list[pa.Array] = []
    offset = 0
    try:
        for batch in _batches(dataset, [id_column], _ID_BATCH_ROWS):
            ids = batch.column(0)
            if ids.null_count:
                row = offset + pc.index(pc.is_null(ids), True).as_py()
                raise CompileError(f"id column {id_column!r} has a null at row {row}")
            chunks.append(ids)
            offset += len(ids)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        raise CompileError(f"the table cannot be read: {_first_line(error)}") from None
    if offset > MAX_ROWS:
        raise CompileError(f"the table has {offset:,} rows; rows are addressed by int32, at most {MAX_ROWS:,}")
    _check_unique(pa.chunked_array(chunks, type=dataset.schema.field(id_column).type), id_column)
    return offset


def _check_unique(ids: pa.ChunkedArray, id_column: str) -> None:
    """Names the first row whose value appeared before, and where it first appeared."""
    if not len(ids) or pc.count_distinct(ids).as_py() == len(ids):
        return
    encoded = pc.dictionary_encode(ids)
    codes = pa.chunked_array([chunk.indices for chunk in encoded.chunks]).combine_chunks()
    # Codes are numbered by first appearance: a row repeats when its code is not above all earlier codes.
    running_max = pc.cumulative_max(codes)
    earlier_max = pa.concat_arrays([pa.array([-1], codes.type), running_max.slice(0, len(codes) - 1)])
    row = pc.index(pc.less_equal(codes, earlier_max), True).as_py()
    first = pc.index(codes, codes[row]).as_py()
    value = ids[row].as_py()
    raise CompileError(f"id column {id_column!r} repeats the value {value!r} at row {row} (first seen at row {first})")


# -- identity ----------------------------------------------------------------------------------


def _files_digest(dataset: ds.FileSystemDataset) -> str:
    """Path, size and modification time of every file: cheap, and changes when a file is rewritten."""
    digest = hashlib.blake2b(digest_size=20)
    filters = getattr(dataset, "_scan_options", None) or {}
    for part in (dataset.format.default_extname, dataset.schema.to_string(), repr(filters.get("filter"))):
        digest.update(part.encode() + b"\0")
    for info in dataset.filesystem.get_file_info(dataset.files):
        digest.update(f"{info.path}\0{info.size}\0{info.mtime_ns}\0".encode())
    return digest.hexdigest()


class _HashSink:
    """A write-only file that only hashes what is written to it."""

    def __init__(self) -> None:
        self.digest = hashlib.blake2b(digest_size=20)
        self.closed = False

    def write(self, data: bytes | memoryview) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def content_digest(dataset: ds.Dataset) -> str:
    """A hash of the data as an IPC stream of fixed-size windows, so chunking does not change it."""
    sink = _HashSink()
    schema = dataset.schema
    with pa.ipc.new_stream(sink, schema) as writer:
        for window in _windows(_batches(dataset, schema.names, _HASH_WINDOW_ROWS), schema):
            writer.write_table(window, max_chunksize=_HASH_WINDOW_ROWS)
    return sink.digest.hexdigest()


def _windows(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.Table]:
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        pending.append(batch)
        count += batch.num_rows
        while count >= _HASH_WINDOW_ROWS:
            table = pa.Table.from_batches(pending, schema=schema)
            yield table.slice(0, _HASH_WINDOW_ROWS).combine_chunks()
            pending = table.slice(_HASH_WINDOW_ROWS).to_batches()
            count -= _HASH_WINDOW_ROWS
    if count:
        yield pa.Table.from_batches(pending, schema=schema).combine_chunks()
