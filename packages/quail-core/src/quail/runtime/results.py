"""QueryResult: the rows, every AI answer (including rows later dropped), the report, explain()."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from quail.runtime.report import QueryReport, ReportValue

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl

ResultValue = None | bool | int | float | str | list["ResultValue"] | dict[str, "ResultValue"]


class Reported(Protocol):
    """What a result's report is: a value that gives itself as the dict `QueryResult.report`."""

    def as_dict(self) -> dict[str, ReportValue]: ...


@dataclass(frozen=True)
class ReceivedReport:
    """A report that came over the wire (`quail.connect`): the dict the server's result gave, as it gave it."""

    values: Mapping[str, ReportValue]

    def as_dict(self) -> dict[str, ReportValue]:
        return copy.deepcopy(dict(self.values))


class QueryResult:
    def __init__(self, table: pa.Table, answer_tables: Mapping[str, pa.Table], report: Reported,
                 explain_text: str) -> None:
        self._table = table
        # a dict is copied; a lazy mapping (a server's answers, fetched when read) is kept as it is
        self.answer_tables: Mapping[str, pa.Table] = dict(answer_tables) if isinstance(answer_tables, dict) \
            else answer_tables
        self._report = report
        self._explain = explain_text

    @property
    def report(self) -> dict[str, ReportValue]:
        return self._report.as_dict()

    @property
    def query_report(self) -> QueryReport:
        """The report as its typed value (what `report` gives as a dict); a result received from a server has only
        the dict."""
        if not isinstance(self._report, QueryReport):
            raise TypeError("this result came from a server: its report is the dict `report`")
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
