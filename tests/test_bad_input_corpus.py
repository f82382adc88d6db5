"""The bad-input corpus: what a hostile new user would try, each case with its expected outcome.

A Python API case raises the stated exception (CompileError, RefusalError, ConfigError — a
ValueError —, TypeError) with a message that names the problem. A command-line case exits 2 with a
one-line message that names the problem, and never a traceback; a final test runs every command-line
case again and lists any that exits 1 or prints a traceback. Every SQL case runs through both the
API and the CLI. Grow the corpus with every bug found: one line per case.

Everything runs in-process on the keyword test backend (the `example-keyword` plugin), so the
corpus takes seconds.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from quail import (
    CompileError,
    DeviceSpec,
    DocumentProvider,
    EngineConfig,
    ExtensionRegistry,
    ModelSpec,
    Refusal,
    RefusalError,
    Session,
    col,
    prompt,
)
from quail.cli import main
from quail.errors import ConfigError
from quail.extend import (
    BackendExecutionContext,
    GpuContext,
    ModelExecution,
    ModelRegion,
    PhysicalCandidate,
    PhysicalResponse,
    PlanningContext,
    SupportResult,
)
from quail.serving import engines as serving
from quail.testing import KeywordBackend

REVIEWS = pa.table({"id": [1, 2, 3], "body": ["great acting", "a dull plot", "acting and plot"]})
ASPECTS = pa.table({"id": [1, 2], "aspect": ["acting", "plot"]})
LONG = pa.table({"id": [1, 2], "body": ["acting " * 3000, "acting"]})
FILTER = "AI_FILTER(PROMPT('Is {0} good?', r.body))"
GOOD = f"SELECT r.id FROM reviews r WHERE {FILTER}"
JOIN = "SELECT r.id FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect)"


@dataclass(frozen=True)
class Raises:
    """An API call that must raise `error` with `names` in its message."""

    id: str
    call: Callable[[Session], object]
    error: type[BaseException]
    names: str


@dataclass(frozen=True)
class Exits:
    """A command line that must exit 2, print `names` to stderr and no traceback. `{dir}` is the data folder."""

    id: str
    argv: tuple[str, ...]
    names: str


# -- SQL: each runs through Session.sql(...).plan() (CompileError) and `quail query` (exit 2) -----------------

SQL: list[tuple[str, str, str]] = [
    ("empty query", "", "got 0"),
    ("only a comment", "-- nothing here", "got 0"),
    ("two statements", f"{GOOD}; SELECT 1", "got 2"),
    ("misspelled SELECT", "SELEC x", "it starts with 'SELEC' (did you mean SELECT?)"),
    ("create table", "CREATE TABLE t (a INT)", "CREATE is not a query"),
    ("drop table", "DROP TABLE reviews", "DROP is not a query"),
    ("insert", "INSERT INTO reviews VALUES (1, 'x')", "INSERT is not a query"),
    ("update", "UPDATE reviews SET body = 'x'", "UPDATE is not a query"),
    ("delete", "DELETE FROM reviews", "DELETE is not a query"),
    ("attach", "ATTACH 'other.db' AS o", "ATTACH is not a query"),
    ("install", "INSTALL httpfs", "INSTALL is not a query"),
    ("copy after a comment", "-- export\nCOPY reviews TO 'out.csv'", "COPY is not a query"),
    ("unknown table", f"SELECT r.id FROM nowhere r WHERE {FILTER}", "'nowhere'"),
    ("unknown selected column", f"SELECT r.nope FROM reviews r WHERE {FILTER}", "r.nope"),
    ("unknown selected alias", f"SELECT x.id FROM reviews r WHERE {FILTER}", "'x'"),
    ("unknown prompt column", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.nope))",
     "r.nope"),
    ("unknown prompt alias", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', x.body))", "'x'"),
    ("table name used where its alias is needed",
     "SELECT r.id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} good?', reviews.body))", "'r'"),
    ("AI function over a number column", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.id))",
     "'id'"),
    ("AI_FILTER without arguments", "SELECT r.id FROM reviews r WHERE AI_FILTER()", "AI_FILTER"),
    ("AI_FILTER with three arguments",
     "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), {'selectivity': 0.5}, 3)",
     "3 arguments"),
    ("AI.IF without arguments", "SELECT r.id FROM reviews r WHERE AI.IF()", "AI"),
    ("template without placeholder", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is it good?', r.body))",
     "placeholder"),
    ("placeholder past the columns", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {1} good?', r.body))",
     "{1}"),
    ("two placeholders one column",
     "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} {1} good?', r.body))", "{1}"),
    ("column without placeholder",
     "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body, r.body))", "placeholder {1}"),
    ("named placeholder", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {x} good?', r.body))",
     "placeholder"),
    ("unclosed placeholder", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0 good?', r.body))",
     "placeholder"),
    ("empty template", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('', r.body))", "placeholder"),
    ("PROMPT without columns", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?'))", "column"),
    ("PROMPT without anything", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT())", "template"),
    ("PROMPT arguments reversed", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT(r.body, 'Is {0} good?'))",
     "template"),
    ("PROMPT number template", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT(5, r.body))", "template"),
    ("selectivity above one",
     "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), {'selectivity': 1.5})",
     "selectivity"),
    ("selectivity below zero",
     "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), {'selectivity': -0.1})",
     "selectivity"),
    ("selectivity as text",
     "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), {'selectivity': 'high'})",
     "selectivity"),
    ("selectivity NULL",
     "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), {'selectivity': NULL})",
     "selectivity"),
    ("selectivity given twice", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), "
     "{'selectivity': 0.5, 'selectivity': 0.2})", "selectivity"),
    ("unknown option", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), {'speed': 1})",
     "'speed'"),
    ("options not an object", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), 0.5)",
     "0.5"),
    ("anchor on a filter", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), "
     "{'anchor': 'zz'})", "'zz'"),
    ("anchor outside the join", JOIN.replace("a.aspect)", "a.aspect), {'anchor': 'q'}") + ")", "'q'"),
    ("alias used twice", f"SELECT r.id FROM reviews r, reviews r WHERE {FILTER}", "'r'"),
    ("unbalanced parenthesis", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body)",
     "syntax error"),
    ("unterminated string", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?, r.body))",
     "syntax error"),
    ("CLASSIFY with no labels", "SELECT r.id, AI.CLASSIFY(r.body, []) AS t FROM reviews r", "labels"),
    ("CLASSIFY with one label", "SELECT r.id, AI.CLASSIFY(r.body, ['a']) AS t FROM reviews r", "two labels"),
    ("CLASSIFY with repeated labels", "SELECT r.id, AI.CLASSIFY(r.body, ['a', 'a']) AS t FROM reviews r",
     "distinct"),
    ("CLASSIFY without labels", "SELECT r.id, AI.CLASSIFY(r.body) AS t FROM reviews r", "AI.CLASSIFY"),
    ("CLASSIFY labels as a string", "SELECT r.id, AI.CLASSIFY(r.body, 'a') AS t FROM reviews r", "'a'"),
    ("SCORE compared with text",
     "SELECT r.id FROM reviews r WHERE AI.SCORE(PROMPT('How good is {0}?', r.body)) >= 'x'", "'x'"),
    ("SCORE compared above one",
     "SELECT r.id FROM reviews r WHERE AI.SCORE(PROMPT('How good is {0}?', r.body)) >= 2", "[0, 1]"),
    ("SCORE compared below zero",
     "SELECT r.id FROM reviews r WHERE AI.SCORE(PROMPT('How good is {0}?', r.body)) >= -1", "[0, 1]"),
    ("SCORE without arguments", "SELECT r.id FROM reviews r WHERE AI.SCORE() >= 0.5", "AI.SCORE"),
    ("EXISTS over an unknown table", "SELECT r.id FROM reviews r WHERE EXISTS (SELECT 1 FROM nowhere a "
     "WHERE AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect)))", "'nowhere'"),
]

SQL_RAISES = [Raises(f"sql: {name}", lambda s, text=text: s.sql(text).plan(), CompileError, names)
              for name, text, names in SQL]
SQL_EXITS = [Exits(f"cli sql: {name}", ("query", text, "--table", "reviews={dir}/reviews.parquet",
                                        "--table", "aspects={dir}/aspects.parquet"), names)
             for name, text, names in SQL]


# -- the Python API -------------------------------------------------------------------------------------------


def config(**fields: object) -> Callable[[Session], object]:
    return lambda _session: EngineConfig(**fields)  # type: ignore[arg-type]


def filtered(session: Session) -> object:
    return session.docs("reviews").alias("r")


CONFIGS = [
    Raises("config: model None", config(model=None), TypeError, "EngineConfig.model"),
    Raises("config: model number", config(model=3), TypeError, "EngineConfig.model"),
    Raises("config: model empty", config(model=""), ConfigError, "EngineConfig.model"),
    Raises("config: device None", config(device=None), TypeError, "EngineConfig.device"),
    Raises("config: device blank", config(device="  "), ConfigError, "EngineConfig.device"),
    Raises("config: backend number", config(backend=5), TypeError, "EngineConfig.backend"),
    Raises("config: backend empty", config(backend=""), ConfigError, "EngineConfig.backend"),
    Raises("config: gpus as text", config(gpus="2"), TypeError, "EngineConfig.gpus"),
    Raises("config: gpus as float", config(gpus=2.0), TypeError, "EngineConfig.gpus"),
    Raises("config: gpus as bool", config(gpus=True), TypeError, "EngineConfig.gpus"),
    Raises("config: gpus None", config(gpus=None), TypeError, "EngineConfig.gpus"),
    Raises("config: gpus zero", config(gpus=0), ConfigError, "EngineConfig.gpus"),
    Raises("config: gpus negative", config(gpus=-1), ConfigError, "EngineConfig.gpus"),
    Raises("config: chunk as text", config(chunk_tokens="2048"), TypeError, "EngineConfig.chunk_tokens"),
    Raises("config: chunk as float", config(chunk_tokens=2.5), TypeError, "EngineConfig.chunk_tokens"),
    Raises("config: chunk None", config(chunk_tokens=None), TypeError, "EngineConfig.chunk_tokens"),
    Raises("config: chunk zero", config(chunk_tokens=0), ConfigError, "EngineConfig.chunk_tokens"),
    Raises("config: chunk too small", config(chunk_tokens=15), ConfigError, "EngineConfig.chunk_tokens"),
    Raises("config: kv budget nan", config(kv_budget_bytes=math.nan), ConfigError, "EngineConfig.kv_budget_bytes"),
    Raises("config: kv budget inf", config(kv_budget_bytes=math.inf), ConfigError, "EngineConfig.kv_budget_bytes"),
    Raises("config: kv budget -inf", config(kv_budget_bytes=-math.inf), ConfigError,
           "EngineConfig.kv_budget_bytes"),
    Raises("config: kv budget negative", config(kv_budget_bytes=-5), ConfigError, "EngineConfig.kv_budget_bytes"),
    Raises("config: kv budget zero", config(kv_budget_bytes=0), ConfigError, "EngineConfig.kv_budget_bytes"),
    Raises("config: kv budget as text", config(kv_budget_bytes="1GB"), TypeError, "EngineConfig.kv_budget_bytes"),
    Raises("config: kv budget as bool", config(kv_budget_bytes=True), TypeError, "EngineConfig.kv_budget_bytes"),
    Raises("config: precision fp16", config(precision="fp16"), ConfigError, "EngineConfig.precision"),
    Raises("config: precision upper case", config(precision="FP32"), ConfigError, "EngineConfig.precision"),
    Raises("config: precision None", config(precision=None), ConfigError, "EngineConfig.precision"),
    Raises("config: page tokens zero", config(kv_page_tokens=0), ConfigError, "EngineConfig.kv_page_tokens"),
    Raises("config: page tokens as text", config(kv_page_tokens="16"), TypeError, "EngineConfig.kv_page_tokens"),
    Raises("config: page tokens as float", config(kv_page_tokens=1.5), TypeError, "EngineConfig.kv_page_tokens"),
    Raises("config: prefix sharing yes", config(prefix_sharing="yes"), ConfigError, "EngineConfig.prefix_sharing"),
    Raises("config: prefix sharing True", config(prefix_sharing=True), ConfigError, "EngineConfig.prefix_sharing"),
    Raises("config: calibration always", config(calibration="always"), ConfigError, "EngineConfig.calibration"),
    Raises("config: oversized drop", config(oversized_documents="drop"), ConfigError,
           "EngineConfig.oversized_documents"),
    Raises("config: oversized None", config(oversized_documents=None), ConfigError,
           "EngineConfig.oversized_documents"),
    Raises("config: unknown field", config(model_name="x"), TypeError, "model_name"),
]

SESSIONS = [
    Raises("session: a backend name instead of a config", lambda _: Session("native"), TypeError, "EngineConfig"),
    Raises("session: a number instead of a config", lambda _: Session(42), TypeError, "EngineConfig"),
    Raises("session: a dict instead of a config", lambda _: Session({"backend": "native"}), TypeError,
           "EngineConfig"),
    Raises("session: unknown backend", lambda _: Session(EngineConfig(backend="nope")), RefusalError, "'nope'"),
    Raises("session: unknown model", lambda _: Session(EngineConfig(model="nope", backend="example-keyword")),
           RefusalError, "'nope'"),
    Raises("session: unknown device", lambda _: Session(EngineConfig(device="tpu", backend="example-keyword")),
           RefusalError, "'tpu'"),
    Raises("session: four devices of a CPU", lambda _: Session(EngineConfig(gpus=4, backend="example-keyword")),
           ConfigError, "gpus"),
    Raises("session: CPU-only backend on a GPU", lambda _: Session(EngineConfig(device="h100-sxm",
                                                                              backend="example-keyword")),
           RefusalError, "h100-sxm"),
    Raises("session: sql None", lambda s: s.sql(None), TypeError, "str"),
    Raises("session: sql bytes", lambda s: s.sql(GOOD.encode()), TypeError, "decode"),
    Raises("session: sql number", lambda s: s.sql(42), TypeError, "str"),
    Raises("session: unknown dialect", lambda s: s.sql(GOOD, dialect="mysql"), CompileError, "'mysql'"),
    Raises("session: dialect None", lambda s: s.sql(GOOD, dialect=None), CompileError, "dialect"),
    Raises("session: unknown order rule", lambda s: s.sql(GOOD, order="random"), CompileError, "'random'"),
    Raises("session: register a number name", lambda s: s.register(5, DocumentProvider.from_table(REVIEWS, "id")),
           TypeError, "str"),
    Raises("session: register an empty name", lambda s: s.register("", DocumentProvider.from_table(REVIEWS, "id")),
           CompileError, "''"),
    Raises("session: register a name with a dash",
           lambda s: s.register("bad-name", DocumentProvider.from_table(REVIEWS, "id")), CompileError, "'bad-name'"),
    Raises("session: register a number, not a table", lambda s: s.register("t", 42), TypeError,
           "DocumentProvider"),
    Raises("session: register None", lambda s: s.register("t", None), TypeError, "DocumentProvider"),
    Raises("session: run with a bogus plan", lambda s: s.sql(GOOD).run(plan="fast"), TypeError, "PhysicalCandidate"),
    Raises("session: docs of an unknown table", lambda s: s.docs("nope"), CompileError, "'nope'"),
    Raises("session: oversized document refused", lambda s: s.sql(GOOD.replace("reviews r", "long r")).plan(),
           RefusalError, "oversized_documents"),
    Raises("session: a backend that cannot plan", lambda _: _example_backend_plan(), RefusalError, "tokenizer"),
]

BUILDER = [
    Raises("builder: prompt with a number template", lambda s: prompt(5, col("r.body")), TypeError, "template"),
    Raises("builder: prompt with a text argument", lambda s: prompt("Is {0} ok?", "r.body"), CompileError,
           "'r.body'"),
    Raises("builder: filter on a string", lambda s: filtered(s).ai_filter("Is it ok?"), CompileError,
           "'Is it ok?'"),
    Raises("builder: filter on None", lambda s: filtered(s).ai_filter(None), CompileError, "None"),
    Raises("builder: unknown column", lambda s: filtered(s).ai_filter(prompt("Is {0} ok?", col("r.nope"))),
           CompileError, "r.nope"),
    Raises("builder: unknown alias", lambda s: filtered(s).ai_filter(prompt("Is {0} ok?", col("x.body"))),
           CompileError, "'x'"),
    Raises("builder: no placeholder", lambda s: filtered(s).ai_filter(prompt("Is it ok?", col("r.body"))),
           CompileError, "placeholder"),
    Raises("builder: selectivity above one",
           lambda s: filtered(s).ai_filter(prompt("Is {0} ok?", col("r.body")), selectivity=2), CompileError,
           "selectivity"),
    Raises("builder: negative limit", lambda s: filtered(s).ai_filter(prompt("Is {0} ok?", col("r.body"))).limit(-1),
           CompileError, "-1"),
    Raises("builder: limit as text", lambda s: filtered(s).ai_filter(prompt("Is {0} ok?", col("r.body"))).limit("3"),
           CompileError, "'3'"),
    Raises("builder: alias not an identifier", lambda s: s.docs("reviews").alias("1r"), CompileError, "'1r'"),
    Raises("builder: join anchor outside", lambda s: filtered(s).ai_join(
        s.docs("aspects").alias("a"), prompt("{0} {1}", col("r.body"), col("a.aspect")), anchor="z"),
        CompileError, "'z'"),
    Raises("builder: join semantics left", lambda s: filtered(s).ai_join(
        s.docs("aspects").alias("a"), prompt("{0} {1}", col("r.body"), col("a.aspect")), semantics="left"),
        CompileError, "'left'"),
    Raises("builder: classify one label", lambda s: filtered(s).ai_classify(col("r.body"), ["a"], "t"),
           CompileError, "two labels"),
    Raises("builder: col None", lambda s: col(None), CompileError, "col(None)"),
]

PROVIDERS = [
    Raises("provider: missing id column", lambda _: DocumentProvider.from_table(pa.table({"x": [1]}), "id"),
           CompileError, "'id'"),
    Raises("provider: repeated id", lambda _: DocumentProvider.from_table(pa.table({"id": [1, 1]}), "id"),
           CompileError, "repeats"),
    Raises("provider: null id", lambda _: DocumentProvider.from_table(pa.table({"id": [1, None]}), "id"),
           CompileError, "null"),
    Raises("provider: a list, not a table", lambda _: DocumentProvider.from_table([1, 2], "id"), TypeError,
           "pyarrow.Table"),
]


class _NoTokenizerBackend:
    """The keyword backend's work, but no tokenizer offered: planning has none to plan with."""

    name = "no-tokenizer"

    def __init__(self) -> None:
        self.inner = KeywordBackend()

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        return self.inner.supports(model, device, gpu_count)

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        return self.inner.plan(region, context)

    def start(self, context: GpuContext) -> ModelExecution:
        return self.inner.start(context)

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        return serving.execute_request(self, context)


def _example_backend_plan() -> object:
    registry = ExtensionRegistry.with_built_ins()
    registry.register_backend(_NoTokenizerBackend())
    with Session(EngineConfig(backend="no-tokenizer"), registry=registry) as session:
        session.register("reviews", DocumentProvider.from_table(REVIEWS, "id"))
        return session.sql(GOOD).plan()


API_CASES = [*SQL_RAISES, *CONFIGS, *SESSIONS, *BUILDER, *PROVIDERS]


# -- the command line -----------------------------------------------------------------------------------------

T = ("--table", "reviews={dir}/reviews.parquet")
KEYWORD = ("--backend", "example-keyword", "--no-progress")
Q = ("query", GOOD)

CLI_CASES = [
    *SQL_EXITS,
    Exits("no subcommand", (), "required"),
    Exits("unknown subcommand", ("nope",), "'nope'"),
    Exits("unknown option", (*Q, *T, "--bogus"), "--bogus"),
    Exits("no query", ("query", *T), "either as an argument or with --file"),
    Exits("query and --file", (*Q, "--file", "{dir}/good.sql", *T), "not both"),
    Exits("--file missing", ("query", "--file", "{dir}/missing.sql", *T), "--file"),
    Exits("--file a directory", ("query", "--file", "{dir}/folder", *T), "directory"),
    Exits("--file not UTF-8", ("query", "--file", "{dir}/latin1.sql", *T), "not UTF-8"),
    Exits("--file empty", ("query", "--file", "{dir}/empty.sql", *T), "got 0"),
    Exits("--table without =", (*Q, "--table", "reviews"), "name=path"),
    Exits("--table without a name", (*Q, "--table", "={dir}/reviews.parquet"), "name=path"),
    Exits("--table without a path", (*Q, "--table", "reviews="), "name=path"),
    Exits("--table missing file", (*Q, "--table", "reviews={dir}/missing.parquet"), "no file or directory"),
    Exits("--table unknown format", (*Q, "--table", "reviews={dir}/notes.txt"), ".txt"),
    Exits("--table twice under one name", (*Q, *T, "--table", "reviews={dir}/aspects.parquet"), "twice"),
    Exits("--table name with a dash", (*Q, "--table", "bad-name={dir}/reviews.parquet"), "'bad-name'"),
    Exits("--table unknown id column", (*Q, "--table", "reviews={dir}/reviews.parquet:nope"), "'nope'"),
    Exits("--table text column read as a number", ("query", "SELECT r.id FROM reviews r WHERE "
          "AI_FILTER(PROMPT('Is {0} good?', r.body))", "--table", "reviews={dir}/numbers.parquet", *KEYWORD), "'body'"),
    Exits("--model unknown", (*Q, *T, "--model", "nope"), "'nope'"),
    Exits("--device unknown", (*Q, *T, "--device", "tpu"), "'tpu'"),
    Exits("--backend unknown", (*Q, *T, "--backend", "nope"), "'nope'"),
    Exits("--backend CPU-only on a GPU", (*Q, *T, "--device", "h100-sxm", "--backend", "example-keyword"),
          "h100-sxm"),
    Exits("--model whose weights are not here", (*Q, *T, "--model", "qwen3-0.6b"), "not on this machine"),
    Exits("--dialect unknown", (*Q, *T, "--dialect", "mysql"), "'mysql'"),
    Exits("--order unknown", (*Q, *T, "--order", "random"), "'random'"),
    Exits("--oversized-documents unknown", (*Q, *T, "--oversized-documents", "drop"), "'drop'"),
    Exits("oversized document refused", (*Q, "--table", "reviews={dir}/long.parquet", *KEYWORD), "oversized"),
    Exits("--explain of a refused plan", (*Q, "--table", "reviews={dir}/long.parquet", "--explain", *KEYWORD),
          "oversized"),
    Exits("--explain of an unknown table", ("query", GOOD.replace("reviews r", "nowhere r"), *T, "--explain",
                                            *KEYWORD), "'nowhere'"),
    Exits("--output unknown format", (*Q, *T, *KEYWORD, "--output", "{dir}/rows.xlsx"), ".xlsx"),
    Exits("--output in a missing directory", (*Q, *T, *KEYWORD, "--output", "{dir}/missing/rows.csv"),
          "does not exist"),
    Exits("--output is a directory", (*Q, *T, *KEYWORD, "--output", "{dir}/folder.csv"), "is a directory"),
    Exits("--output under a file", (*Q, *T, *KEYWORD, "--output", "{dir}/notes.txt/rows.csv"), "not a directory"),
    Exits("--output in /proc", (*Q, *T, *KEYWORD, "--output", "/proc/self/rows.csv"), "cannot create a file"),
    Exits("--output with a trailing slash", (*Q, *T, *KEYWORD, "--output", "{dir}/rows.csv/"), "names a directory"),
    Exits("--output empty", (*Q, *T, *KEYWORD, "--output", ""), "--output"),
    Exits("backends: unknown device", ("backends", "--device", "tpu"), "'tpu'"),
    Exits("backends: unknown model", ("backends", "--model", "nope"), "'nope'"),
    Exits("backends: zero devices", ("backends", "--gpus", "0"), "gpus"),
    Exits("backends: four devices of a CPU", ("backends", "--gpus", "4"), "gpus"),
    Exits("backends: devices as text", ("backends", "--gpus", "x"), "'x'"),
    Exits("demo: unknown device", ("demo", "--device", "tpu"), "'tpu'"),
    Exits("--table a ragged CSV", (*Q, "--table", "reviews={dir}/ragged.csv", *KEYWORD), "Expected 2 columns"),
    Exits("--table a garbage Parquet", (*Q, "--table", "reviews={dir}/garbage.parquet", *KEYWORD),
          "cannot read"),
    Exits("--table a list-typed id column", (*Q, "--table", "reviews={dir}/listid.parquet", *KEYWORD),
          "ids are numbers or text"),
    Exits("--table a directory of mixed files", (*Q, "--table", "reviews={dir}/mixed", *KEYWORD),
          "files of one format"),
    Exits("demo: unknown backend", ("demo", "--backend", "nope"), "'nope'"),
    Exits("bench: unknown scale", ("bench", "--scale", "huge"), "'huge'"),
    Exits("bench --quality: unknown model", ("bench", "--quality", "--models", "nope"), "unknown model 'nope'"),
    Exits("bench --quality: no model", ("bench", "--quality", "--models", ","), "has no model to measure"),
    Exits("bench --quality: no reviews", ("bench", "--quality", "--reviews", "0"), "--reviews must be 1 to 240"),
    Exits("bench: unknown model", ("bench", "--model", "nope"), "unknown model 'nope'"),
    Exits("--table a DuckDB table name with an unbalanced quote",
          (*Q, "--table", 'reviews={dir}/films.duckdb:t"; ATTACH \'x\'; --', *KEYWORD), "is not a table name"),
    Exits("LIMIT past any row count", ("query", f"{GOOD} LIMIT 18446744073709551616", *T, *KEYWORD),
          "LIMIT 18446744073709551616 is larger than any row count"),
    Exits("OFFSET past any row count", ("query", f"{GOOD} LIMIT 1 OFFSET 99999999999999999999", *T, *KEYWORD),
          "OFFSET 99999999999999999999 is larger"),
    Exits("cache stats of a directory", ("cache", "stats", "--store", "{dir}/folder"), "is a directory"),
    Exits("cache clear of a directory", ("cache", "clear", "--store", "{dir}/folder"), "is a directory"),
    Exits("cache clear of a text file", ("cache", "clear", "--store", "{dir}/notes.txt"), "not an answer store"),
    Exits("glob() of another dialect", ("query", "SELECT * FROM glob('/etc/*')", *T, *KEYWORD),
          "GLOB is missing its first argument"),
]


# -- running the cases ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad-inputs")
    pq.write_table(REVIEWS, folder / "reviews.parquet")
    pq.write_table(ASPECTS, folder / "aspects.parquet")
    pq.write_table(LONG, folder / "long.parquet")
    pq.write_table(pa.table({"id": [1, 2], "body": [10, 20]}), folder / "numbers.parquet")
    pa_csv.write_csv(REVIEWS, folder / "reviews.csv")
    (folder / "good.sql").write_text(GOOD)
    (folder / "latin1.sql").write_bytes("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Déjà {0}?', r.body))"
                                        .encode("latin-1"))
    (folder / "empty.sql").write_text("")
    (folder / "notes.txt").write_text("not a table")
    (folder / "folder").mkdir()
    (folder / "folder.csv").mkdir()
    (folder / "ragged.csv").write_text("id,body\n1,a fine film\n2,a dull film,extra\n")
    (folder / "garbage.parquet").write_bytes(b"these bytes are not a Parquet file")
    pq.write_table(pa.table({"id": [[1], [2]], "body": ["a", "b"]}), folder / "listid.parquet")
    import duckdb

    with duckdb.connect(str(folder / "films.duckdb")) as database:
        database.execute("CREATE TABLE t AS SELECT 1 AS id, 'a fine film' AS body")
    (folder / "mixed").mkdir()
    pa_csv.write_csv(REVIEWS, folder / "mixed" / "part-1.csv")
    pq.write_table(REVIEWS, folder / "mixed" / "part-2.parquet")
    return folder


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    with Session(EngineConfig(backend="example-keyword")) as opened:
        opened.register("reviews", DocumentProvider.from_table(REVIEWS, "id"))
        opened.register("aspects", DocumentProvider.from_table(ASPECTS, "id"))
        opened.register("long", DocumentProvider.from_table(LONG, "id"))
        yield opened


def run_cli(case: Exits, folder: Path) -> tuple[int, str]:
    argv = [part.replace("{dir}", str(folder)) for part in case.argv]
    if argv[:1] == ["query"] and "--backend" not in argv:
        argv += ["--no-progress"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own usage errors
            code = int(exit_.code or 0)
    return code, err.getvalue()


def test_the_corpus_is_large_and_every_case_is_named_once():
    ids = [case.id for case in (*API_CASES, *CLI_CASES)]
    assert len(ids) >= 150
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", API_CASES, ids=lambda case: case.id)
def test_an_api_case_raises_its_error_naming_the_problem(case, session):
    with pytest.raises(case.error) as caught:
        case.call(session)
    assert case.names in str(caught.value), f"{case.id}: the message does not name {case.names!r}"


@pytest.mark.plugins
@pytest.mark.parametrize("case", CLI_CASES, ids=lambda case: case.id)
def test_a_cli_case_exits_2_with_a_message_naming_the_problem(case, data):
    code, err = run_cli(case, data)
    assert code == 2, err
    assert case.names in err and "Traceback" not in err


def test_no_cli_case_exits_1_or_prints_a_traceback(data):
    bad = {}
    for case in CLI_CASES:
        code, err = run_cli(case, data)
        if code == 1 or "Traceback" in err or "internal error" in err:
            bad[case.id] = err.strip().splitlines()[-1:] or [f"exit {code}"]
    assert not bad, json.dumps(bad, indent=1)


# -- fixed on the way: inputs that must work ------------------------------------------------------------------


def test_a_table_path_with_a_colon_is_read_whole_when_it_exists(data, capsys):
    folder = data / "with colon"
    folder.mkdir(exist_ok=True)
    pa_csv.write_csv(REVIEWS, folder / "colon:name.csv")
    code = main(["query", GOOD, "--table", f"reviews={folder / 'colon:name.csv'}", *KEYWORD])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("id\n")


def test_a_table_path_with_an_id_column_after_the_colon_still_works(data, capsys):
    code = main(["query", GOOD, "--table", f"reviews={data / 'reviews.csv'}:id", *KEYWORD])
    assert code == 0, capsys.readouterr().err


def test_a_second_table_under_one_name_never_silently_replaces_the_first(data, capsys):
    code = main(["query", GOOD, "--table", f"reviews={data / 'reviews.parquet'}",
                 "--table", f"reviews={data / 'long.parquet'}", *KEYWORD])
    assert code == 2 and "given twice" in capsys.readouterr().err


def test_tables_a_user_would_expect_to_just_work_do(tmp_path):
    """A directory of CSVs, a header-only CSV (no rows, so no answers), a categorical text column."""
    (tmp_path / "parts").mkdir()
    pa_csv.write_csv(REVIEWS.slice(0, 2), tmp_path / "parts" / "a.csv")
    pa_csv.write_csv(REVIEWS.slice(2), tmp_path / "parts" / "b.csv")
    (tmp_path / "header.csv").write_text("id,body\n")
    categorical = pa.table({"id": REVIEWS.column("id"), "body": REVIEWS.column("body").dictionary_encode()})
    pq.write_table(categorical, tmp_path / "categorical.parquet")
    expected = {"parts": REVIEWS.num_rows, "header.csv": 0, "categorical.parquet": REVIEWS.num_rows}
    for name, rows in expected.items():
        out = tmp_path / f"{name}.out.parquet"
        code = main(["query", "SELECT r.id, AI.SCORE(PROMPT('Is {0} good?', r.body)) AS s FROM reviews r",
                     "--table", f"reviews={tmp_path / name}", "--output", str(out), *KEYWORD])
        assert code == 0, name
        assert pq.read_table(out).num_rows == rows, name


@pytest.mark.parametrize("name", ["g[ab].csv", "s*.csv", "q?.csv"])
def test_a_path_with_glob_characters_names_that_one_file(tmp_path, name):
    """A path is a path: `g[ab].csv` is read, never `ga.csv` and `gb.csv` beside it (DuckDB's readers glob)."""
    pa_csv.write_csv(REVIEWS.slice(0, 1), tmp_path / name)
    for decoy in ("ga.csv", "gb.csv", "sa.csv", "qa.csv"):
        pa_csv.write_csv(REVIEWS.slice(1), tmp_path / decoy)
    with Session(EngineConfig(backend="example-keyword")) as session:
        session.register("reviews", str(tmp_path / name), id_column="id")
        rows = session.sql("SELECT r.id, AI.SCORE(PROMPT('Is {0} good?', r.body)) AS s FROM reviews r").run()
        assert rows.collect().column("id").to_pylist() == [1]


@pytest.mark.plugins
def test_compute_ray_where_ray_cannot_be_imported_is_refused_saying_what_to_install(data, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # what a missing ray looks like to `import ray`
    code = main([*Q, "--table", f"reviews={data / 'reviews.parquet'}", *KEYWORD, "--compute", "ray"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "the ray package does not import" in err and "pip install" in err


def test_a_garbage_tokenizer_file_is_a_model_file_error_naming_it(tmp_path):
    pytest.importorskip("tokenizers")
    from quail import ModelFileError
    from quail.data.tokenizer import HuggingFaceTokenizer

    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": {"type": "BPE", "vocab": {"a": "not a number"}}, 7: 8}')
    tokenizer = HuggingFaceTokenizer(path, None)
    with pytest.raises(ModelFileError, match=f"the tokenizer file {path} cannot be read"):
        tokenizer.encode("text")


# -- the relational sandbox -----------------------------------------------------------------------------------


SANDBOX_ESCAPES = {
    "read a file": "AND r.body IN (SELECT column0 FROM read_csv('{outside}', header = false))",
    "read a text file": "AND r.body IN (SELECT content FROM read_text('{outside}'))",
}


@pytest.mark.parametrize("escape", ["read a file", "read a text file"])
def test_the_relational_part_reads_only_registered_tables_unless_told(tmp_path, escape):
    outside = tmp_path / "secret.csv"
    outside.write_text("great acting\n")
    condition = SANDBOX_ESCAPES[escape].format(outside=outside, dir=tmp_path)
    sql = f"{GOOD} {condition}"
    with Session(EngineConfig(backend="example-keyword", cache="off")) as session:
        session.register("reviews", REVIEWS)
        with pytest.raises(CompileError, match=r"file system operations are disabled.*external_access=True"):
            session.sql(sql).run()
    with Session(EngineConfig(backend="example-keyword", cache="off", external_access=True)) as session:
        session.register("reviews", REVIEWS)
        session.sql(sql).run()  # a local user's own files, when asked for


def test_a_file_fed_to_the_model_through_a_subquery_is_refused_before_any_model_work(tmp_path):
    outside = tmp_path / "secret.csv"
    outside.write_text("id,body\n1,the password is swordfish\n")
    sql = (f"SELECT s.id FROM (SELECT * FROM read_csv('{outside}')) s "
           "WHERE AI_FILTER(PROMPT('Is {0} good?', s.body))")
    with Session(EngineConfig(backend="example-keyword", cache="off")) as session, \
            pytest.raises(CompileError, match="file system operations are disabled"):
        session.sql(sql)


def test_registered_files_of_every_kind_stay_readable_in_the_sandbox(tmp_path, data):
    """Registering a file opens it to the sandbox (its directory too, for a directory of files), and every
    table registered before stays bound."""
    import duckdb

    with duckdb.connect(str(tmp_path / "films.duckdb")) as database:
        database.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 'great acting'), (2, 'dull')) v(id, body)")
    (tmp_path / "parts").mkdir()
    pq.write_table(REVIEWS, tmp_path / "parts" / "a.parquet")
    with Session(EngineConfig(backend="example-keyword", cache="off")) as session:
        session.register("a", data / "reviews.parquet")
        session.register("b", data / "reviews.csv", id_column="id")
        session.register("c", tmp_path / "films.duckdb", table="t")
        session.register("d", tmp_path / "parts")
        for table in "abcd":
            rows = session.sql(f"SELECT r.id FROM {table} r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body))").run()
            assert rows.count() >= 0
        pq.write_table(ASPECTS.rename_columns(["id", "body"]), tmp_path / "parts" / "b.parquet")  # a new file
        assert session.sql("SELECT r.id FROM d r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body))").run().count() >= 0


@pytest.mark.parametrize("sql", [
    f"SELECT r.id FROM reviews r, __quail_rows_0 x WHERE {FILTER}",
    f"SELECT r.id, (SELECT count(*) FROM __quail_rows_0) AS n FROM reviews r WHERE {FILTER}",
    f"SELECT r.id, __quail.x FROM reviews r WHERE {FILTER}",
    f"SELECT r.id FROM reviews __QUAIL_mine WHERE {FILTER}",
], ids=["joined", "in a subquery", "the outputs relation", "as an alias"])
def test_quails_own_relations_cannot_be_named(session, sql):
    with pytest.raises(CompileError, match="reserved for Quail's own relations"):
        session.sql(sql)


def test_no_extension_is_installed_and_no_duckdb_folder_made(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with Session(EngineConfig(backend="example-keyword", cache="off")) as session:
        session.register("reviews", REVIEWS)
        with pytest.raises(CompileError, match="spatial"):
            session.sql(f"SELECT r.id, ST_Point(1, 2) AS p FROM reviews r WHERE {FILTER}").run()
    assert not (tmp_path / ".duckdb").exists()


def test_a_full_temporary_directory_is_said_plainly_not_an_internal_error(data, monkeypatch, capsys):
    import errno

    import quail.data.tokens

    def full(path, batches):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(quail.data.tokens, "_write", full)
    code = main([*Q, "--table", f"reviews={data / 'reviews.parquet'}", *KEYWORD, "--cache", "off"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "no space left on the device writing" in err and "TMPDIR" in err


def test_a_document_longer_than_pyarrows_default_block_is_read(tmp_path, capsys):
    """A 1.3 MB JSON line or CSV field: pyarrow's 1 MiB default blocks refuse it ("straddling object") or,
    for a JSON line read for a few columns, read its values as nulls."""
    import csv

    long = "word " * 260_000
    with (tmp_path / "long.jsonl").open("w") as out:
        out.write(json.dumps({"id": 1, "body": long}) + "\n" + json.dumps({"id": 2, "body": "great acting"}) + "\n")
    with (tmp_path / "long.csv").open("w", newline="") as out:
        csv.writer(out).writerows([["id", "body"], [1, long], [2, "great acting"]])
    for name in ("long.jsonl", "long.csv"):
        output = tmp_path / f"{name}.parquet"
        code = main(["query", "SELECT r.id, length(r.body) AS n, AI.SCORE(PROMPT('Is {0} good?', r.body)) AS s "
                     "FROM reviews r", "--table", f"reviews={tmp_path / name}", *KEYWORD, "--oversized-documents",
                     "skip", "--output", str(output)])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert "oversized documents (skip): {'r': 1}" in out.out, "the long document was read whole, not as NULL"
        assert pq.read_table(output).select(["id", "n"]).to_pylist() == [{"id": 2, "n": 12}]


def test_control_characters_in_documents_reach_the_terminal_as_visible_escapes():
    from quail.presentation import format_rows

    shown = format_rows(pa.table({"body\x1b[2J": ["\x1b[31mred\x1b[0m\r\x07 bell"]}))
    assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown
    assert "\\x1b[31mred" in shown and "body\\x1b[2J" in shown


def test_a_cross_join_hidden_in_a_cte_is_said_before_any_token_and_shown_in_explain(monkeypatch):
    import quail.runtime.views
    from quail.errors import LargeInputWarning

    monkeypatch.setattr(quail.runtime.views, "LARGE_SCAN_ROWS", 1000)
    sql = ("WITH x AS (SELECT a1.id * 100 + a2.id AS id, a1.body || ' ' || a2.body AS body FROM films a1, films a2) "
           "SELECT x.id FROM x WHERE AI_FILTER(PROMPT('Is {0} good?', x.body))")
    with Session(EngineConfig(backend="example-keyword", cache="off")) as session:
        session.register("films", pa.table({"id": list(range(40)), "body": [f"film {i}" for i in range(40)]}))
        with pytest.warns(LargeInputWarning, match="x \\(a CTE or subquery\\) keeps 1,600 rows"):
            assert "Scan x AS x [scan_x]  — rows≈1,600" in session.sql(sql).explain()
        with pytest.warns(LargeInputWarning):
            session.sql(sql).run()
