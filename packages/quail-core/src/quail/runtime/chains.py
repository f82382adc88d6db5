"""Running a block with two AI predicates over the same two tables (`quail.frontend.chains`): the pairs the first
holds for, then the statement over them.

Each step is a statement of its own, planned the way the session plans any statement (the planner of one block,
the general rule, a further chain when more than two predicates read the two tables): the first step's distinct
document tuples are registered as a relation while the second runs, and the report sums both.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Protocol

import pyarrow as pa

from quail.backends.base import OrderRule, PhysicalCandidate
from quail.frontend.chains import PairChain, first_stage, rest_stage
from quail.frontend.lookups import stand_in
from quail.frontend.sql import ParsedStatement
from quail.runtime.coordinator import QuerySession
from quail.runtime.lookups import merged_answers, merged_report
from quail.runtime.results import QueryResult

PAIRS, REST = "pairs", "rest"
"""The two steps' names in the report's node metrics (`pairs/filter_…`) and answer tables."""


class StatementQuery(Protocol):
    """What each step is: a query of the session's (`Query`, `LookupQuery`, a further `ChainedQuery`, ...)."""

    def plan(self) -> PhysicalCandidate | tuple[PhysicalCandidate, ...]: ...

    def explain(self, verbose: bool = False, analyze: bool = False) -> str: ...

    def run(self) -> QueryResult: ...


StatementPlanner = Callable[[ParsedStatement], StatementQuery]
"""The session's way from a statement to its query (as `Session.sql` plans one)."""


class ChainedQuery:
    """A statement whose block asks two AI predicates of the same pairs: explain(), plan(), run(), collect() as a
    `Query` offers them. The first step is planned at once; the second is compiled now (over no pairs: a wrong name
    is a CompileError before any model work) and planned once the first has answered."""

    def __init__(self, session: QuerySession, planner: StatementPlanner, parsed: ParsedStatement, chain: PairChain,
                 order: OrderRule | None = None) -> None:
        self.session = session
        self.chain = chain
        self.order = order
        self.relation = f"__quail_pairs_{uuid.uuid4().hex[:8]}"
        self._planner = planner
        stage = first_stage(chain, parsed.statement)
        self._empty = session.database.describe(stand_in(stage)).empty_table()
        self.first = planner(replace(parsed, statement=stage, remarks=()))
        self.rest_statement = rest_stage(chain, parsed.statement, self.relation)
        self._rest = replace(parsed, statement=self.rest_statement)
        with self._registered(self._empty):
            planner(self._rest)

    @contextmanager
    def _registered(self, pairs: pa.Table) -> Iterator[None]:
        with self.session.database.registered({self.relation: pairs}):
            yield

    def plan(self) -> PhysicalCandidate | tuple[PhysicalCandidate, ...]:
        """The first step's plan (the second is planned over the pairs it finds)."""
        return self.first.plan()

    def explain(self, verbose: bool = False, analyze: bool = False) -> str:
        if analyze:
            return self.run().explain()
        return "\n".join(self._described(self.first.explain(verbose), None))

    def run(self) -> QueryResult:
        self.session.check_open()
        started = time.perf_counter()
        first = self.first.run()
        pairs = first.collect()
        with self._registered(pairs):
            rest = self._planner(self._rest).run()
        results = {PAIRS: first, REST: rest}
        remark = f"{self.chain.describe()}: {pairs.num_rows:,} pair(s) of documents hold for the first"
        report = merged_report(self.session, results, started, self.order, (remark,))
        text = "\n".join(self._described(first.explain(), rest.explain()))
        return QueryResult(rest.collect(), merged_answers(results), report, text)

    def collect(self) -> pa.Table:
        return self.run().collect()

    def _described(self, first: str, rest: str | None) -> list[str]:
        lines = [f"== {self.chain.describe()} ==", "-- step 1, the pairs the first predicate holds for:"]
        lines.extend(f"   {line}" for line in first.splitlines())
        lines.append(f"-- step 2, the statement over them ({self.relation}):")
        if rest is None:
            lines.append("   planned when step 1 has answered (it reads the pairs); the statement:")
            shown = self.rest_statement.sql(dialect="duckdb", pretty=True)
        else:
            shown = rest
        lines.extend(f"   {line}" for line in shown.splitlines())
        return lines
