"""`quail query`: run AI SQL against Parquet / CSV / JSONL / Arrow files and DuckDB tables from the command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from quail.config import OVERSIZED_POLICIES, EngineConfig
from quail.data.providers import DocumentProvider
from quail.errors import CompileError, ConfigError, UsageError
from quail.frontend.sql import Dialect
from quail.outputs import OUTPUT_SUFFIXES, OutputTarget
from quail.presentation import format_report, format_rows, progress_bar
from quail.session import Session

READERS = {
    ".parquet": DocumentProvider.from_parquet, ".pq": DocumentProvider.from_parquet,
    ".csv": DocumentProvider.from_csv,
    ".jsonl": DocumentProvider.from_jsonl, ".ndjson": DocumentProvider.from_jsonl,
    ".arrow": DocumentProvider.from_ipc, ".feather": DocumentProvider.from_ipc, ".ipc": DocumentProvider.from_ipc,
}
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
        """A path that exists is read whole, colons and all; `database.duckdb:table` names a table of a
        DuckDB database; otherwise a last `:name` is the id column."""
        name, equals, rest = text.partition("=")
        if not equals or not name or not rest:
            raise CompileError(f"--table {text!r}: write name=path[:id_col] or name=database.duckdb:table")
        if ":" not in rest or Path(rest).exists():
            return cls(name, Path(rest), "id")
        for suffix in DATABASES:
            head, found, tail = rest.partition(f"{suffix}:")
            if found:
                table, _, id_column = tail.partition(":")
                return cls(name, Path(head + suffix), id_column or None, table)
        path, _, id_column = rest.rpartition(":")
        return cls(name, Path(path), id_column or "id")

    def register(self, session: Session) -> None:
        """Register the table: a file through its DocumentProvider, a DuckDB database's table through DuckDB."""
        if self.path.suffix.lower() not in DATABASES or not self.path.is_file():
            try:
                provider = self.provider()
            except CompileError as error:
                if str(error).startswith(f"--table {self.name}"):
                    raise
                raise CompileError(f"--table {self.name}: {error}") from None
            session.register(self.name, provider)
            return
        if self.table is None:
            raise CompileError(f"--table {self.name}: {self.path} is a DuckDB database; write "
                               f"{self.name}={self.path}:table")
        try:
            session.register(self.name, self.path, id_column=self.id_column, table=self.table)
        except ValueError as error:
            raise CompileError(f"--table {self.name}: {error}") from None

    def directory_suffix(self) -> str:
        """The one file format a directory's files share (a directory is read as one table of them)."""
        suffixes = {p.suffix.lower() for p in self.path.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))}
        if len(suffixes) != 1:
            found = ", ".join(sorted(s or "(none)" for s in suffixes)) or "no files"
            raise CompileError(f"--table {self.name}: the directory {self.path} must hold files of one format "
                               f"({', '.join(sorted(READERS))}); it holds {found}")
        return next(iter(suffixes))

    def provider(self) -> DocumentProvider:
        if not self.path.exists():
            raise CompileError(f"--table {self.name}: no file or directory {self.path}")
        suffix = self.directory_suffix() if self.path.is_dir() else self.path.suffix.lower()
        reader = READERS.get(suffix)
        if reader is None:
            raise CompileError(f"--table {self.name}: cannot read {self.path.suffix or 'a file without suffix'}; "
                               f"use one of {', '.join(sorted([*READERS, *DATABASES]))}")
        return reader(self.path, self.id_column or "id")


def table_arguments(texts: list[str]) -> list[TableArgument]:
    """Every `--table`, each name once: a second table under one name would silently replace the first."""
    tables = [TableArgument.parse(text) for text in texts]
    seen: dict[str, TableArgument] = {}
    for table in tables:
        earlier = seen.setdefault(table.name, table)
        if earlier is not table:
            raise UsageError(f"--table {table.name} is given twice ({earlier.path} and {table.path}); "
                             f"give each table its own name")
    return tables


def output_path(text: str) -> Path:
    """An --output path; a trailing slash names a directory, which Path() would quietly drop."""
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} names a directory; name the file to write, e.g. {text}rows.parquet")
    return Path(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sql", nargs="?", help="the query (or use --file)")
    parser.add_argument("-f", "--file", type=Path, help="read the query from a file")
    parser.add_argument("-t", "--table", action="append", default=[], metavar="NAME=PATH[:ID_COL]",
                        help="register a table: Parquet, CSV, JSONL or Arrow (the id column defaults to 'id'), "
                             "or NAME=DATABASE.duckdb:TABLE for a table of a DuckDB database")
    add_engine_arguments(parser)
    parser.add_argument("--dialect", choices=("snowflake", "bigquery"), default="snowflake")
    parser.add_argument("--order", choices=("by_cost", "as_written"))
    parser.add_argument("--explain", action="store_true", help="print the plan and exit without running")
    parser.add_argument("-o", "--output", type=output_path,
                        help=f"write the rows to a {', '.join(OUTPUT_SUFFIXES)} file (checked before the model "
                             "runs; an existing file is replaced only once the new one is complete)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--external-access", action="store_true",
                        help="let the query's SQL read files that are not registered tables (read_csv('...'), "
                             "ATTACH, COPY); off by default")


ENGINE_OPTIONS = ("model", "embedding_model", "model_aliases", "device", "backend", "cache", "chunk_tokens", "compute",
                  "workers", "address", "worker_cpus", "worker_gpus", "oversized_documents")
"""The EngineConfig fields every command that runs queries takes as options (`quail query`, `quail serve`)."""


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `ENGINE_OPTIONS`; each left out is None, so the config's own default (or a file's) holds."""
    parser.add_argument("--model")
    parser.add_argument("--embedding-model", help="the embedding model of AI.EMBED / AI.SIMILARITY and blocking "
                                                  "(default: all-minilm-l6-v2)")
    parser.add_argument("--model-alias", dest="model_aliases", action="append", type=model_alias,
                        metavar="NAME=MODEL", help="a model name statements may use (AI_COMPLETE('llama3.1-8b', …), "
                                                   "endpoint => '…') for one of Quail's models; repeat for more")
    parser.add_argument("--device")
    parser.add_argument("--backend")
    parser.add_argument("--compute", help="where model work runs: local (default), process, or a plugin's (ray)")
    parser.add_argument("--workers", type=int, help="workers a distributed provider splits the query over")
    parser.add_argument("--address", help="cluster of a distributed provider: 'auto' or an address (default: a "
                                          "local one)")
    parser.add_argument("--worker-cpus", type=float, help="CPUs (threads) each distributed worker holds")
    parser.add_argument("--worker-gpus", type=float, help="GPUs each distributed worker holds")
    parser.add_argument("--oversized-documents", choices=OVERSIZED_POLICIES,
                        help="a document too long for one forward pass with its prompt: refuse the query "
                             "(default), skip that document, or truncate it to what fits")
    parser.add_argument("--cache", help="the answer store: auto (default), off, or a store file's path")
    parser.add_argument("--chunk-tokens", type=int, help="tokens per forward pass (answers are committed every "
                                                         "few passes)")


def model_alias(text: str) -> tuple[str, str]:
    """`--model-alias NAME=MODEL` as the pair EngineConfig.model_aliases holds."""
    alias, equals, model = text.partition("=")
    if not equals or not alias.strip() or not model.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: write NAME=MODEL, e.g. llama3.1-8b=qwen2.5-coder-1.5b-instruct")
    return alias.strip(), model.strip()


def engine_config(values: Mapping[str, object]) -> EngineConfig:
    """EngineConfig(**values), its complaint about a field said in the command line's words (`--worker-cpus`, not
    `EngineConfig.worker_cpus`)."""
    try:
        return EngineConfig(**values)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        message = str(error)
        for key in (f.name for f in fields(EngineConfig)):
            message = message.replace(f"EngineConfig.{key} ", f"--{key.replace('_', '-')} ")
        raise ConfigError(message) from None


def query_text(args: argparse.Namespace) -> str:
    if (args.sql is None) == (args.file is None):
        raise CompileError("give the query either as an argument or with --file, not both")
    if args.file is None:
        return str(args.sql)
    try:
        return args.file.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--file {args.file}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"--file {args.file}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset "
                         f"{error.start}); save the query as UTF-8") from None


def config_of(args: argparse.Namespace) -> EngineConfig:
    keys = (*ENGINE_OPTIONS, "external_access")
    return engine_config({key: getattr(args, key) for key in keys if getattr(args, key, None) is not None})


def write_output(table: pa.Table, path: Path, suffix: str) -> None:
    """Write `table` to `path` in the format `suffix` names (`OutputTarget` picks a temporary path)."""
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
    tables = table_arguments(args.table)
    target = None if args.output is None else OutputTarget.checked(args.output)
    dialect: Dialect = args.dialect
    with Session(config_of(args)) as session:
        for table in tables:
            table.register(session)
        query = session.sql(text, dialect=dialect, order=args.order)
        if args.explain:
            print(query.explain(), file=out)
            query.plan()  # a refused plan is shown above and is still an error: exit 2, not 0
            return 0
        listener = None if args.no_progress else progress_bar(err)
        if listener is not None:
            session.registry.register_progress_listener(listener)
        result = query.run()
        if target is not None:
            target.write(result.collect(), write_output)
            print(f"wrote {result.count()} rows to {args.output}", file=out)
        else:
            print(format_rows(result.collect()), file=out)
        print(f"-- report --\n{format_report(result.report)}", file=out)
    return 0
