"""ScanView: the rows of one alias after the conditions pushed to its scan, addressed by position.

A query reads each alias through a view that DuckDB computed from its source: only the columns the
query needs, only the rows its column predicates keep. The view is materialised once into a
memory-mapped Arrow file, so the rest of the engine (token store, planner, model nodes, the
relational tail) addresses its rows by int32 position within the view, and a document the
predicates removed is never tokenized, planned for or shown to the model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from quail.data.providers import MAX_ROWS, Columns, Rows, checked_columns, content_digest
from quail.data.sources import quoted
from quail.errors import CompileError


@runtime_checkable
class DocumentSource(Protocol):
    """A table the token store reads documents from (a ScanView, or a DocumentProvider)."""

    @property
    def num_rows(self) -> int: ...

    @property
    def columns(self) -> tuple[str, ...]: ...

    @property
    def arrow_schema(self) -> pa.Schema: ...

    @property
    def identity(self) -> str: ...

    def column_identity(self, column: str) -> str:
        """Equal for equal contents of one column: keys the column's token file."""
        ...

    def scan(self, columns: Columns = None, batch_rows: int = ...) -> Iterator[pa.RecordBatch]: ...

    def take(self, rows: Rows, columns: Columns = None) -> pa.Table: ...

    def to_table(self, columns: Columns = None) -> pa.Table: ...


class ScanView:
    """Rows of one alias as its scan left them; `sql` is the DuckDB query that computed them."""

    def __init__(self, table: pa.Table, sql: str, path: Path | None = None) -> None:
        if table.num_rows > MAX_ROWS:
            raise CompileError(f"the scan keeps {table.num_rows:,} rows; rows are addressed by int32, at most "
                               f"{MAX_ROWS:,}")
        self._table = table
        self.sql = sql
        self.path = path
        self._identity: str | None = None
        self._column_identities: dict[str, str] = {}

    @property
    def num_rows(self) -> int:
        return self._table.num_rows

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._table.column_names)

    @property
    def arrow_schema(self) -> pa.Schema:
        return self._table.schema

    @property
    def identity(self) -> str:
        """A hash of the rows: equal views (whatever computed them) share their token files."""
        if self._identity is None:
            self._identity = f"view:{content_digest(ds.dataset(self._table))}"
        return self._identity

    def column_identity(self, column: str) -> str:
        """A hash of one column: views that keep the same documents share their token file, whatever
        else they read."""
        if column not in self._column_identities:
            self._column_identities[column] = f"column:{content_digest(ds.dataset(self.to_table([column])))}"
        return self._column_identities[column]

    def scan(self, columns: Columns = None, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be positive, got {batch_rows}")
        table = self._table.select(self._checked(columns))
        for batch in table.to_batches(max_chunksize=batch_rows):
            if batch.num_rows:
                yield batch

    def take(self, rows: Rows, columns: Columns = None) -> pa.Table:
        """The rows at these positions, in order; a NULL position gives a row of NULLs (an unmatched outer row)."""
        positions = _positions(rows)
        if len(positions) and positions.null_count < len(positions):
            low, high = pc.min_max(positions).values()
            for value in (low.as_py(), high.as_py()):
                if not 0 <= value < self.num_rows:
                    raise IndexError(f"row {value} is out of range for a view of {self.num_rows} rows")
        return self._table.select(self._checked(columns)).take(positions)

    def to_table(self, columns: Columns = None) -> pa.Table:
        return self._table.select(self._checked(columns))

    def _checked(self, columns: Columns) -> list[str]:
        return checked_columns(columns, self.columns)

    def __repr__(self) -> str:
        return f"ScanView(rows={self.num_rows}, columns={list(self.columns)})"


def _positions(rows: Rows) -> pa.Array:
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    array = rows if isinstance(rows, pa.Array) else pa.array(list(rows), type=pa.int32())
    if not pa.types.is_integer(array.type):
        raise TypeError(f"row positions must be integers, got {array.type}")
    return array


def view_sql(source: str, alias: str, columns: Sequence[str], where: str | None, ctes: str | None,
             order: str | None = None) -> str:
    """SELECT the columns FROM a relation AS the alias WHERE the pushed-down conditions (DuckDB SQL), numbered in
    `order` when the query's ORDER BY reads only this table."""
    listed = ", ".join(f"{quoted(alias)}.{quoted(c)}" for c in columns) or f'NULL AS {quoted("__quail_row")}'
    head = f"{ctes} " if ctes else ""
    condition = f" WHERE {where}" if where else ""
    ordered = f" ORDER BY {order}" if order else ""
    return f"{head}SELECT {listed} FROM {source} AS {quoted(alias)}{condition}{ordered}"
