"""QueryResult: the rows, every AI answer (including rows later dropped), the report, explain()."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from quail.runtime.report import QueryReport, ReportValue

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl

ResultValue = None | bool | int | float | str | list["ResultValue"] | dict[str, "ResultValue"]


class QueryResult:
    def __init__(self, table: pa.Table, answer_tables: Mapping[str, pa.Table], report: QueryReport,
                 explain_text: str) -> None:
        self._table = table
        self.answer_tables: Mapping[str, pa.Table] = dict(answer_tables)
        self._report = report
        self._explain = explain_text

    @property
    def report(self) -> dict[str, ReportValue]:
        return self._report.as_dict()

    @property
    def query_report(self) -> QueryReport:
        """The report as its typed value (what `report` gives as a dict)."""
        return self._report

    def collect(self) -> pa.Table:
        return self._table

    def to_rows(self) -> list[dict[str, ResultValue]]:
        return self._table.to_pylist()

    def count(self) -> int:
        return self._table.num_rows

    def __len__(self) -> int:
        return self._table.num_rows

    def to_pandas(self) -> pd.DataFrame:
        return self._table.to_pandas()

    def to_polars(self) -> pl.DataFrame:
        """The rows as a polars DataFrame (polars is needed only for this: pip install polars)."""
        try:
            import polars
        except ImportError as error:
            raise ImportError("to_polars() needs polars: pip install polars") from error
        frame = polars.from_arrow(self._table)
        assert isinstance(frame, polars.DataFrame)
        return frame

    def execute_stream(self, batch_rows: int = 1024) -> Iterator[pa.RecordBatch]:
        """The rows in bounded record batches."""
        yield from self._table.to_batches(max_chunksize=batch_rows)

    def explain(self) -> str:
        """The plan with measured values beside the estimates."""
        return self._explain

    def __repr__(self) -> str:
        return f"QueryResult({self.count()} rows, columns={self._table.column_names})"
