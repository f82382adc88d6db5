"""Document providers: registered tables of text documents, each with a validated id column."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from quail.errors import CompileError


@dataclass(frozen=True)
class TableSchema:
    """What the compiler needs of a registered table: its columns and which one is the id."""

    name: str
    columns: tuple[str, ...]
    id_column: str


class DocumentProvider:
    """A table of documents. The id column is mandatory: non-null and unique."""

    def __init__(self, table: pa.Table, id_column: str) -> None:
        _validate_ids(table, id_column)
        self._table = table
        self.id_column = id_column

    @classmethod
    def from_table(cls, table: pa.Table, id_col: str) -> DocumentProvider:
        return cls(table, id_col)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._table.column_names)

    @property
    def num_rows(self) -> int:
        return self._table.num_rows

    def schema(self, name: str) -> TableSchema:
        return TableSchema(name=name, columns=self.columns, id_column=self.id_column)

    def to_table(self, columns: list[str] | None = None) -> pa.Table:
        return self._table if columns is None else self._table.select(columns)


def _validate_ids(table: pa.Table, id_column: str) -> None:
    if id_column not in table.column_names:
        raise CompileError(f"id column {id_column!r} is missing; columns are {list(table.column_names)}")
    ids = table.column(id_column)
    if ids.null_count:
        row = pc.index(pc.is_null(ids), True).as_py()
        raise CompileError(f"id column {id_column!r} has a null at row {row}")
    counts = pc.value_counts(ids)
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    if len(repeated):
        value = repeated[0]["values"].as_py()
        first, second = pc.indices_nonzero(pc.equal(ids, value))[:2].to_pylist()
        raise CompileError(
            f"id column {id_column!r} repeats the value {value!r} at row {second} (first seen at row {first})"
        )
