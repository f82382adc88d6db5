"""Running a statement by the general rule (`quail.frontend.lookups`): its AI calls as lookups, round by round,
each planned and run by the ordinary planner over the distinct inputs it needs, then the statement on DuckDB.

The rounds are worked out twice: when the query is made, with empty stand-ins for the lookups' answers, so
every name, type and refusal is found before any model work; and when it runs, with the answers.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import SqlglotError

from quail.backends.base import OrderRule, PhysicalCandidate
from quail.compute.request import sum_known
from quail.errors import CompileError
from quail.frontend.aggregates import aggregates
from quail.frontend.lookups import VALUE, Block, Lookup, has_ai_calls, next_stage, shared_inner, shared_rows
from quail.frontend.relational import relocated
from quail.frontend.spec import QuerySpec
from quail.frontend.sql import Dialect, ParsedStatement, read_statement
from quail.runtime.aggregates import reduce_groups
from quail.runtime.coordinator import QuerySession
from quail.runtime.embeddings import EmbeddingQuery
from quail.runtime.report import QueryReport
from quail.runtime.results import QueryResult

LOOKUP_PREFIX = "__quail_ai_"


Session = QuerySession
"""What the rule needs of the session that asked: what a query needs (`runtime.coordinator`)."""


class Query(Protocol):
    """A lookup's AI query, as the session's planner makes it."""

    def plan(self) -> PhysicalCandidate: ...

    def explain(self, verbose: bool = False, analyze: bool = False) -> str: ...

    def run(self) -> QueryResult: ...


Planner = Callable[[QuerySpec, OrderRule | None], Query]
"""The session's way from a query spec to a planned Query."""


class _Relations:
    """The session's DuckDB as the rule describes relations (registered tables and lookups so far). A relation is
    described once per working-out of the rounds: the rule asks for the columns of one source for every column
    of every call that names no table (lookup names are new each time, so a remembered schema never goes stale)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._described: dict[str, pa.Schema] = {}

    def describe(self, sql: str) -> pa.Schema:
        if sql not in self._described:
            self._described[sql] = self.session.database.describe(sql)
        return self._described[sql]

    def schema_of(self, table: str) -> pa.Schema | None:
        found = self.session.database.schema(table)
        return None if found is None else found.arrow


@dataclass(frozen=True)
class _Round:
    groups: tuple[tuple[Lookup | Block, ...], ...]
    """The round's lookups, those asked as one query together (`shared_rows`)."""
    queries: tuple[Query, ...]
    """One per group."""

    @property
    def lookups(self) -> tuple[Lookup | Block, ...]:
        return tuple(lookup for group in self.groups for lookup in group)


@dataclass
class _Worked:
    rounds: list[_Round]
    statement: exp.Expression
    results: dict[str, QueryResult]
    table: pa.Table | None = None
    aggregates: list[str] = field(default_factory=list)
    """What explain() says of each AI aggregate."""


class LookupQuery:
    """A statement the planner of one query block cannot plan whole, answered by the general rule. It offers
    what `Query` offers: explain(), plan(), run(), collect()."""

    def __init__(self, session: Session, planner: Planner, parsed: ParsedStatement, dialect: Dialect,
                 order: OrderRule | None = None) -> None:
        self.session = session
        self.planner = planner
        self.statement = parsed.statement
        self.remarks = parsed.remarks
        self.dialect = dialect
        self.order = order
        self._dry = self._work(run=False)

    @property
    def lookups(self) -> tuple[Lookup | Block, ...]:
        return tuple(lookup for r in self._dry.rounds for lookup in r.lookups)

    def plan(self) -> tuple[PhysicalCandidate, ...]:
        """The physical plans of the first round's lookups (later rounds are planned over earlier answers)."""
        return tuple(query.plan() for query in self._dry.rounds[0].queries) if self._dry.rounds else ()

    def explain(self, verbose: bool = False, analyze: bool = False) -> str:
        if analyze:
            return self.run().explain()
        return _explain(self._dry, {}, verbose, self.remarks)

    def run(self) -> QueryResult:
        self.session.check_open()
        started = time.perf_counter()
        worked = self._work(run=True)
        assert worked.table is not None
        calls = sum(len(round_.lookups) for round_ in worked.rounds) + len(worked.aggregates)
        queries = len(worked.results)
        remarks = (f"answered by the general rule: {calls} AI call(s) as lookups over the distinct inputs of their "
                   f"tables in {queries} {'query' if queries == 1 else 'queries'}, the statement on DuckDB",
                   *self.remarks)
        report = merged_report(self.session, worked.results, started, self.order, remarks)
        return QueryResult(worked.table, merged_answers(worked.results), report,
                           _explain(worked, worked.results, False, self.remarks))

    def collect(self) -> pa.Table:
        return self.run().collect()

    # -- the rounds --------------------------------------------------------------------------------------

    def _aggregates(self, worked: _Worked, relations: dict[str, pa.Table], prefix: str, counter: itertools.count,
                    run: bool) -> None:
        """The statement's AI aggregates, once no other AI call is left: each distinct group answered (when
        `run`; bound over an empty stand-in otherwise), the statement reading them."""
        session = self.session
        found, statement = aggregates(worked.statement, prefix, counter)
        for aggregate in found:
            if not run:
                session.database.check(aggregate.groups, {name: t.schema for name, t in relations.items()})
                relations[aggregate.name] = GROUPS.empty_table()
                worked.aggregates.append(f"{aggregate.call}: each distinct group's texts answered by "
                                         f"generations, in rounds when a group exceeds one prompt")
                continue
            groups = session.database.run(aggregate.groups, relations).column("k").to_pylist()
            documents = f"{aggregate.name}_documents"
            reduction = reduce_groups(groups, aggregate.instruction, session.tokenizer,
                                      min(session.config.chunk_tokens, session.model.context_length),
                                      self._generations(relations, documents), documents)
            for number, result in enumerate(reduction.results, start=1):
                worked.results[f"{aggregate.name}_round{number}"] = result
            relations[aggregate.name] = pa.table({"k": groups, "v": reduction.answers}, schema=GROUPS)
            worked.aggregates.append(f"{aggregate.call}: {len(groups):,} distinct groups answered in "
                                     f"{len(reduction.results)} round(s) of generations")
        worked.statement = statement

    def _generations(self, relations: Mapping[str, pa.Table],
                     name: str) -> Callable[[exp.Select, pa.Table], QueryResult]:
        """One round of an aggregate's generations: its query planned and run with the round's documents
        registered under `name`."""
        def run(select: exp.Select, documents: pa.Table) -> QueryResult:
            with self.session.database.registered({**relations, name: documents}):
                spec = read_statement(select, self.session.database, "snowflake")
                return self.planner(spec, self.order).run()
        return run

    def _query(self, group: tuple[Lookup | Block, ...]) -> Query:
        """An embedding lookup's query embeds its distinct texts; every other group's is planned by the planner (the
        calls of a group as the outputs of one query over their rows)."""
        lookup = group[0]
        if isinstance(lookup, Lookup) and lookup.kind == "embed":
            return EmbeddingQuery(self.session, lookup)
        inner = lookup.inner if len(group) == 1 else shared_inner([g for g in group if isinstance(g, Lookup)])
        return self.planner(read_statement(inner, self.session.database, self.dialect), self.order)

    def _answers(self, lookup: Lookup | Block, result: QueryResult | None, index: int | None) -> pa.Table:
        """The lookup's relation: its answers from `result` (the `index`-th value of a shared query), or an empty
        stand-in when nothing ran."""
        if result is None:
            if isinstance(lookup, Block):
                return self.session.database.describe(lookup.stand_in).empty_table()
            return _empty(lookup)
        table = result.collect()
        if isinstance(lookup, Block):
            return table
        if index is not None:
            table = table.select([*(f"doc{i}" for i in range(lookup.inputs)), f"{VALUE}{index}"])
        return pa.table(dict(zip(lookup.columns, table.columns, strict=True)))

    def _work(self, run: bool) -> _Worked:
        """Every round's lookups, planned (and run when `run`), then the statement on DuckDB (when `run`) or
        bound there (when not): a wrong name or type is a CompileError before any model work."""
        session = self.session
        prefix = f"{LOOKUP_PREFIX}{uuid.uuid4().hex[:8]}_"
        counter = itertools.count()
        relations: dict[str, pa.Table] = {}
        worked = _Worked([], self.statement, {})
        describer = _Relations(session)
        while True:
            with session.database.registered(relations):
                try:
                    stage = next_stage(worked.statement, describer, prefix, counter)
                except SqlglotError as error:
                    raise CompileError(f"the statement cannot be rewritten for its AI calls: {error}") from None
                if not stage.lookups:
                    if has_ai_calls(worked.statement):
                        raise CompileError("the AI calls of this statement read tables that are AI results of "
                                           "each other; write them in order, one CTE per step")
                    break
                groups = tuple(shared_rows(stage.lookups))
                queries = tuple(self._query(group) for group in groups)
                for group, query in zip(groups, queries, strict=True):
                    answered = query.run() if run else None
                    if answered is not None:
                        worked.results[group[0].name] = answered
                    for index, lookup in enumerate(group):
                        relations[lookup.name] = self._answers(lookup, answered, index if len(group) > 1 else None)
            worked.rounds.append(_Round(groups, queries))
            worked.statement = stage.statement
        self._aggregates(worked, relations, prefix, counter, run)
        try:
            sql = worked.statement.sql(dialect="duckdb")
        except SqlglotError as error:
            raise CompileError(f"the statement cannot be written for DuckDB: {error}") from None
        try:
            if run:
                worked.table = session.database.run(sql, relations)
            else:
                session.database.check(sql, {name: table.schema for name, table in relations.items()})
        except CompileError as error:
            raise relocated(error, self.statement) from None
        return worked


GROUPS = pa.schema([pa.field("k", pa.list_(pa.string())), pa.field("v", pa.string())])
"""An AI aggregate's answers: each distinct group's texts, and the answer over them."""


def _empty(lookup: Lookup) -> pa.Table:
    fields = [pa.field(f"doc{i}", pa.string()) for i in range(lookup.inputs)]
    return pa.schema([*fields, pa.field(VALUE, lookup.value)]).empty_table()


# -- what the run says ---------------------------------------------------------------------------------------


def merged_answers(results: Mapping[str, QueryResult]) -> dict[str, pa.Table]:
    """The answer tables of queries run as parts of one statement, each under `name/node`."""
    return {f"{name}/{node}": table for name, result in results.items()
            for node, table in result.answer_tables.items()}


def merged_report(session: Session, results: Mapping[str, QueryResult], started: float, order: OrderRule | None,
                  remarks: Sequence[str]) -> QueryReport:
    """One report of the queries a statement ran as parts (`results` by name): their work summed, each node's
    metrics under `name/node`, `remarks` first and then theirs."""
    reports = [result.query_report for result in results.values()]
    said = list(remarks)
    for report in reports:
        said.extend(r for r in report.remarks if r not in said)
    return QueryReport(
        backend=session.backend.name, model=_models(session, reports), device=session.device.name,
        order_rule=order or "by_cost", wall_s=time.perf_counter() - started,
        estimated_seconds=sum_known([r.estimated_seconds for r in reports]) if reports else 0.0,
        sol_seconds=sum_known([r.sol_seconds for r in reports]) if reports else 0.0,
        boot_s=next((r.boot_s for r in reports if r.boot_s is not None), None),
        boot_kind=next((r.boot_kind for r in reports if r.boot_kind is not None), None),
        fresh_tokens=sum_known([r.fresh_tokens for r in reports]) if reports else 0,
        cached_tokens=sum_known([r.cached_tokens for r in reports]) if reports else 0,
        minimum_tokens=sum_known([r.minimum_tokens for r in reports]) if reports else 0,
        stages=tuple(s for r in reports for s in r.stages),
        node_metrics={f"{name}/{node}": metrics for name, result in results.items()
                      for node, metrics in result.query_report.node_metrics.items()},
        remarks=tuple(said), engine=tuple(dict.fromkeys(e for r in reports for e in r.engine)),
        shards=tuple(s for r in reports for s in r.shards),
        null_inputs={f"{name}/{node}": count for name, result in results.items()
                     for node, count in (result.query_report.null_inputs or {}).items()},
    )


def _models(session: Session, reports: list[QueryReport]) -> str:
    """The generative models the lookups answered with (a call may name its own); the session's when none did."""
    models = session.registry.models
    used = [name for r in reports for name in r.model.split(", ") if name in models
            and models[name].kind == "generative"]
    return ", ".join(dict.fromkeys(used)) or session.model.name


def _explain(worked: _Worked, results: Mapping[str, QueryResult], verbose: bool, remarks: tuple[str, ...]) -> str:
    lines = ["== Answered by the general rule: each AI call a lookup over the distinct inputs of its table =="]
    lines.extend(f"- {remark}" for remark in remarks)
    for number, round_ in enumerate(worked.rounds, start=1):
        for group, query in zip(round_.groups, round_.queries, strict=True):
            for lookup in group:
                lines.extend(_described(lookup, number))
            name = group[0].name
            if len(group) > 1:
                lines.append(f"   asked as one query over the same rows ({len(group)} calls, v0 … v{len(group) - 1}): "
                             "each document tokenized once, its KV shared by the calls")
            if number > 1 and name not in results:
                lines.append("   planned when the rounds before it have answered (it reads their results)")
                continue
            shown = results[name].explain() if name in results else query.explain(verbose)
            lines.extend(f"   {line}" for line in shown.splitlines())
    lines.extend(f"-- AI aggregate {note}" for note in worked.aggregates)
    lines.append("== The statement on DuckDB, each AI call reading its lookup ==")
    lines.append(worked.statement.sql(dialect="duckdb", pretty=True))
    return "\n".join(lines)


def _described(lookup: Lookup | Block, number: int) -> list[str]:
    if isinstance(lookup, Block) and lookup.pairs:
        return [f"-- round {number}, {lookup.name}: {lookup.text} over the pairs of its two tables: planned as an AI "
                "join of them, the statement reading whether each pair of documents is among those it holds for"]
    if isinstance(lookup, Block):
        return [f"-- round {number}, {lookup.name}: the block {lookup.text} joins on AI: planned whole by the "
                "planner of one block, its rows read as a table"]
    pushed = "; ".join(lookup.pushed) if lookup.pushed else (
        "none (the call is read in an ON clause, or its block has no condition on that table alone)")
    return [f"-- round {number}, {lookup.name}: {lookup.call} over {lookup.table}",
            f"   conditions applied below it: {pushed}"]
