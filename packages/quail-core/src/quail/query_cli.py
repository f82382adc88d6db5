"""`quail query`: run AI SQL against Parquet / CSV / JSONL / Arrow files and DuckDB tables from the command line."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from quail.config import EngineConfig
from quail.data.sources import SUFFIXES
from quail.demo import format_report, format_rows, progress_bar
from quail.errors import CompileError
from quail.frontend.sql import Dialect
from quail.session import Session

OUTPUTS = (".parquet", ".csv", ".json", ".jsonl")
DATABASES = (".duckdb", ".db")


@dataclass(frozen=True)
class TableArgument:
    """`name=path[:id_col]`, or `name=database.duckdb:table[:id_col]`, from the command line."""

    name: str
    path: Path
    id_column: str | None
    table: str | None = None

    @classmethod
    def parse(cls, text: str) -> TableArgument:
        name, equals, rest = text.partition("=")
        if not equals or not name or not rest:
            raise CompileError(f"--table {text!r}: write name=path[:id_col] or name=database.duckdb:table")
        if Path(rest).exists():
            return cls(name, Path(rest), "id")
        for suffix in DATABASES:
            head, found, tail = rest.partition(f"{suffix}:")
            if found:
                table, _, id_column = tail.partition(":")
                return cls(name, Path(head + suffix), id_column or None, table)
        path, _, id_column = rest.rpartition(":") if ":" in rest else (rest, "", "id")
        return cls(name, Path(path), id_column or "id")

    def register(self, session: Session) -> None:
        """Read the table into the session (DuckDB reads the file; ids are checked when named)."""
        if not self.path.exists():
            raise CompileError(f"--table {self.name}: no file or directory {self.path}")
        suffix = self.path.suffix.lower()
        if self.path.is_file() and suffix not in SUFFIXES:
            raise CompileError(f"--table {self.name}: cannot read {suffix or 'a file without suffix'}; "
                               f"use one of {', '.join(sorted(SUFFIXES))}")
        if suffix in DATABASES and self.table is None:
            raise CompileError(f"--table {self.name}: {self.path} is a DuckDB database; write "
                               f"{self.name}={self.path}:table")
        try:
            session.register(self.name, self.path, id_column=self.id_column, table=self.table)
        except (ValueError, FileNotFoundError) as error:
            raise CompileError(f"--table {self.name}: {error}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sql", nargs="?", help="the query (or use --file)")
    parser.add_argument("-f", "--file", type=Path, help="read the query from a file")
    parser.add_argument("-t", "--table", action="append", default=[], metavar="NAME=PATH[:ID_COL]",
                        help="register a table: Parquet, CSV, JSONL or Arrow (the id column defaults to 'id'), "
                             "or NAME=DATABASE.duckdb:TABLE for a table of a DuckDB database")
    parser.add_argument("--model")
    parser.add_argument("--device")
    parser.add_argument("--backend")
    parser.add_argument("--dialect", choices=("snowflake", "bigquery"), default="snowflake")
    parser.add_argument("--order", choices=("by_cost", "as_written"))
    parser.add_argument("--explain", action="store_true", help="print the plan and exit without running")
    parser.add_argument("-o", "--output", type=Path, help=f"write the rows to {', '.join(OUTPUTS)}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def query_text(args: argparse.Namespace) -> str:
    if (args.sql is None) == (args.file is None):
        raise CompileError("give the query either as an argument or with --file, not both")
    if args.file is None:
        return str(args.sql)
    try:
        return args.file.read_text()
    except OSError as error:
        raise CompileError(f"--file {args.file}: {error.strerror or error}") from None


def config_of(args: argparse.Namespace) -> EngineConfig:
    chosen = {key: getattr(args, key) for key in ("model", "device", "backend") if getattr(args, key)}
    return EngineConfig(**chosen)


def write_output(table: pa.Table, path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        pq.write_table(table, path)
    elif suffix == ".csv":
        pa_csv.write_csv(table, path)
    elif suffix == ".jsonl":
        path.write_text("".join(_json_line(row) for row in table.to_pylist()))
    else:
        import json

        path.write_text(json.dumps(table.to_pylist(), default=str, indent=1) + "\n")


def _json_line(row: dict[str, object]) -> str:
    import json

    return json.dumps(row, default=str) + "\n"


def run_query_command(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    text = query_text(args)
    tables = [TableArgument.parse(t) for t in args.table]
    if args.output is not None and args.output.suffix.lower() not in OUTPUTS:
        raise CompileError(f"--output {args.output}: write one of {', '.join(OUTPUTS)}")
    dialect: Dialect = args.dialect
    with Session(config_of(args)) as session:
        for table in tables:
            table.register(session)
        query = session.sql(text, dialect=dialect, order=args.order)
        if args.explain:
            print(query.explain(), file=out)
            return 0
        listener = None if args.no_progress else progress_bar(err)
        if listener is not None:
            session.registry.register_progress_listener(listener)
        result = query.run()
        if args.output is not None:
            write_output(result.collect(), args.output)
            print(f"wrote {result.count()} rows to {args.output}", file=out)
        else:
            print(format_rows(result.collect()), file=out)
        print(f"-- report --\n{format_report(result.report)}", file=out)
    return 0
