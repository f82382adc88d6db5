"""Token store: each document column tokenized once into a memory-mapped Arrow IPC file.

A corpus larger than memory stays on disk: the column is tokenized in bounded batches written one by
one, then mapped, so resident memory does not grow with the number of documents. Files are keyed by
(content identity, column, tokenizer identity): equal content is tokenized once per store. A NULL
text is data, not an error: its token list is NULL, and no AI function spends model work on it.
"""

from __future__ import annotations

import hashlib
import os
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.compute as pc

from quail.data.providers import Rows
from quail.data.scan import DocumentSource
from quail.data.scratch import ScratchDirectory
from quail.data.tokenizer import Tokenizer
from quail.errors import CompileError, QuailError

TOKENS_SCHEMA = pa.schema([pa.field("tokens", pa.list_(pa.int32()))])

DEFAULT_BATCH_ROWS = 1024
DEFAULT_BATCH_BYTES = 1 << 20
"""Text handed to the tokenizer at once: its token lists are Python objects, so this bounds memory."""
FILE_BATCH_TOKENS = 1 << 20
"""Tokens per record batch in a file: opening one touches each batch's metadata page (and its neighbours)."""


@dataclass(frozen=True)
class LengthSummary:
    """Token counts of a set of documents: what the planner prices prefill work from."""

    count: int
    total: int
    total_squares: int
    maximum: int

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


@dataclass(frozen=True)
class TokenColumn:
    """The token ids of one column, one list per row in provider order, mapped from `path`."""

    path: Path
    tokens: pa.ChunkedArray = field(repr=False, compare=False)
    truncated_to: int | None = None
    _lengths: pa.Int32Array = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = [pc.fill_null(pc.list_value_length(chunk), 0) for chunk in self.tokens.chunks]
        object.__setattr__(self, "_lengths", pa.concat_arrays(parts) if parts else pa.array([], pa.int32()))

    @classmethod
    def open(cls, path: Path) -> TokenColumn:
        """Zero-copy: the arrays point into the mapped file, which stays mapped while they live."""
        with pa.memory_map(str(path), "r") as source:
            table = pa.ipc.open_file(source).read_all()
        return cls(path, table.column("tokens"))

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, limit: int) -> TokenColumn:
        """The same rows, each cut to its first `limit` tokens; chunks with no longer row are shared, not copied."""
        if limit < 1:
            raise ValueError(f"a truncated document keeps at least one token, got limit {limit}")
        chunks = [pc.list_slice(chunk, 0, limit) if (pc.max(pc.list_value_length(chunk)).as_py() or 0) > limit
                  else chunk for chunk in self.tokens.chunks]
        return TokenColumn(self.path, pa.chunked_array(chunks, self.tokens.type), limit)

    def lengths(self) -> pa.Int32Array:
        """Token count per row, from the list offsets (the token values are not read); 0 for a NULL text."""
        return self._lengths

    @property
    def null_count(self) -> int:
        """Rows whose text is NULL."""
        return self.tokens.null_count

    def present(self) -> pa.BooleanArray:
        """Per row: does it hold a document (its text is not NULL)?"""
        parts = [pc.is_valid(chunk) for chunk in self.tokens.chunks]
        return pa.concat_arrays(parts) if parts else pa.array([], pa.bool_())

    def present_lengths(self) -> pa.Int32Array:
        """Token counts of the rows that hold a document: what the planner prices."""
        return self._lengths.filter(self.present()) if self.null_count else self._lengths

    def take(self, rows: Rows) -> pa.ListArray:
        return self.tokens.take(_indices(rows)).combine_chunks()

    def row(self, i: int) -> tuple[int, ...]:
        if not 0 <= i < len(self.tokens):
            raise IndexError(f"row {i} is out of range for a column of {len(self.tokens)} rows")
        return tuple(self.tokens[i].values.to_pylist())

    def summary(self) -> LengthSummary:
        return summarize(self.lengths())

    def summary_of(self, rows: Rows) -> LengthSummary:
        return summarize(self.lengths().take(_indices(rows)))


def summarize(lengths: pa.Array) -> LengthSummary:
    wide = lengths.cast(pa.int64())
    return LengthSummary(
        count=len(wide),
        total=pc.sum(wide).as_py() or 0,
        total_squares=pc.sum(pc.multiply(wide, wide)).as_py() or 0,
        maximum=pc.max(wide).as_py() or 0,
    )


def _indices(rows: Rows) -> pa.Array:
    if isinstance(rows, pa.ChunkedArray):
        return rows.combine_chunks()
    return rows if isinstance(rows, pa.Array) else pa.array(rows, type=pa.int32())


class TokenStore:
    """Token files for a session. Creates a scratch directory on first use unless given one;
    `close()` removes every file (and the directory) it created. A scratch directory outlives a
    killed process only until the next one is made (`quail.data.scratch`)."""

    def __init__(self, directory: Path | None = None, *, batch_rows: int = DEFAULT_BATCH_ROWS,
                 batch_bytes: int = DEFAULT_BATCH_BYTES) -> None:
        if batch_rows < 1 or batch_bytes < 1:
            raise ValueError(f"batch_rows and batch_bytes must be positive, got {batch_rows} and {batch_bytes}")
        self._directory = Path(directory) if directory is not None else None
        self._batch_rows = batch_rows
        self._batch_bytes = batch_bytes
        self._columns: dict[tuple[str, str, str], TokenColumn] = {}
        self._created: list[Path] = []
        self._owned: list[ScratchDirectory] = []
        self._finalizer = weakref.finalize(self, _remove, self._created, self._owned)

    @property
    def directory(self) -> Path | None:
        """Where token files go; None until the first file when the store picks a temporary one."""
        return self._directory

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def tokens(self, provider: DocumentSource, column: str, tokenizer: Tokenizer) -> TokenColumn:
        """The column's tokens, tokenizing it only the first time this content meets this tokenizer."""
        if self.closed:
            raise QuailError("the token store is closed")
        _check_text(provider, column)
        key = (provider.column_identity(column), column, tokenizer.identity)
        cached = self._columns.get(key)
        if cached is None:
            cached = self._columns[key] = TokenColumn.open(self._file(key, provider, column, tokenizer))
        return cached

    def _file(self, key: tuple[str, str, str], provider: DocumentSource, column: str,
              tokenizer: Tokenizer) -> Path:
        path = self._ensure_directory() / _file_name(key)
        if not path.exists():  # an existing file was written whole by an earlier store (atomic rename)
            batches = _encoded(provider, column, tokenizer, self._batch_rows, self._batch_bytes)
            _write(path, batches)
            self._created.append(path)
            pa.default_memory_pool().release_unused()  # allocators keep freed scan buffers otherwise
        return path

    def _ensure_directory(self) -> Path:
        if self._directory is None:
            scratch = ScratchDirectory("tokens")
            self._owned.append(scratch)
            self._directory = scratch.path
        self._directory.mkdir(parents=True, exist_ok=True)
        return self._directory

    def close(self) -> None:
        """Remove the files this store created; safe to call twice."""
        self._columns.clear()
        self._finalizer()

    def __enter__(self) -> TokenStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def _file_name(key: tuple[str, str, str]) -> str:
    digest = hashlib.blake2b("\0".join(key).encode(), digest_size=16)
    return f"tokens-{digest.hexdigest()}.arrow"


def _remove(created: list[Path], owned: list[ScratchDirectory]) -> None:
    for path in created:
        path.unlink(missing_ok=True)
    for scratch in owned:
        scratch.remove()


def _write(path: Path, batches: Iterator[pa.RecordBatch]) -> None:
    """Batch by batch into a partial file, renamed into place only when complete."""
    partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    try:
        with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, TOKENS_SCHEMA) as writer:
            for batch in batches:
                writer.write_batch(batch)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _check_text(provider: DocumentSource, column: str) -> None:
    if column not in provider.columns:
        raise CompileError(f"unknown column {column!r}; columns are {list(provider.columns)}")
    kind = provider.arrow_schema.field(column).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type  # a categorical text column (pandas "category") is text
    if pa.types.is_null(kind):
        return  # no value at all (a header-only CSV, an all-NULL column): every document is NULL
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise CompileError(f"column {column!r} holds {kind}, not text; AI functions read text columns")


def _encoded(provider: DocumentSource, column: str, tokenizer: Tokenizer, batch_rows: int,
             batch_bytes: int) -> Iterator[pa.RecordBatch]:
    """Token lists gathered into record batches of about `FILE_BATCH_TOKENS` tokens."""
    pending: list[pa.Array] = []
    tokens = 0
    for lists in _token_lists(provider, column, tokenizer, batch_rows, batch_bytes):
        pending.append(lists)
        tokens += len(lists.values)
        if tokens >= FILE_BATCH_TOKENS:
            yield pa.record_batch([pa.concat_arrays(pending)], schema=TOKENS_SCHEMA)
            pending, tokens = [], 0
    if pending:
        yield pa.record_batch([pa.concat_arrays(pending)], schema=TOKENS_SCHEMA)


def _token_lists(provider: DocumentSource, column: str, tokenizer: Tokenizer, batch_rows: int,
                 batch_bytes: int) -> Iterator[pa.ListArray]:
    for batch in provider.scan([column], batch_rows=batch_rows):
        for piece in _pieces(batch.column(0), batch_bytes):
            yield _encode(piece.to_pylist(), tokenizer)


def _pieces(texts: pa.Array, batch_bytes: int) -> Iterator[pa.Array]:
    """Consecutive slices of about `batch_bytes` of text (at least one row each)."""
    start, used = 0, 0
    for i, size in enumerate(pc.fill_null(pc.binary_length(texts), 0).to_pylist()):
        if used + size > batch_bytes and i > start:
            yield texts.slice(start, i - start)
            start, used = i, 0
        used += size
    if start < len(texts):
        yield texts.slice(start)


def _encode(texts: Sequence[str | None], tokenizer: Tokenizer) -> pa.ListArray:
    """Token lists of the texts; a NULL text has a NULL list (it is never tokenized)."""
    present = [text for text in texts if text is not None]
    ids = tokenizer.encode_batch(present) if present else []
    if len(ids) != len(present):
        raise QuailError(f"tokenizer {tokenizer.identity!r} returned {len(ids)} token lists for {len(present)} texts")
    encoded = iter(ids)
    return pa.array([None if text is None else next(encoded) for text in texts], type=pa.list_(pa.int32()))
