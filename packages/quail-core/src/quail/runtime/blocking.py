"""Running a blocked AI join (`quail.frontend.blocking`): the pairs chosen by embeddings, then the statement.

Each of the join's two documents has its distinct texts embedded (an `EmbeddingQuery` each: stored, never computed
twice); a flat inner-product index over the `{1}` texts' unit vectors gives every `{0}` text its nearest partners
(exact: on the sizes a model can judge, an exhaustive search is milliseconds — see docs/embeddings.md); the pairs are
registered as a relation and the rewritten statement is planned by the ordinary planner, which asks the model only
about them. After the run, a sample of the pairs left out is judged with the same prompt, so the report estimates
what the blocking missed (recall) from measurement, not assumption.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from quail.backends.base import OrderRule, PhysicalCandidate
from quail.errors import CompileError
from quail.frontend.blocking import (
    LEFT,
    PAIRS_ALIAS,
    RIGHT,
    BlockedJoin,
    anchored,
    blocked_joins,
    pairs_relation,
    unblocked,
    without_blocking,
)
from quail.frontend.embedding_forms import MODEL_OPTION
from quail.frontend.lookups import LOOKUP_ALIAS, VALUE, Lookup
from quail.frontend.spec import QuerySpec
from quail.frontend.sql import Dialect, ParsedStatement, read_parsed
from quail.frontend.syntax import EMBEDDING, ai_call
from quail.physical import nodes as ph
from quail.runtime.embeddings import EmbeddingQuery, Session
from quail.runtime.report import BlockingReport
from quail.runtime.results import QueryResult

PAIRS = pa.schema([pa.field(LEFT, pa.string()), pa.field(RIGHT, pa.string())])
RECALL_SAMPLE = 32
"""Pairs outside the blocks judged after the run to estimate the recall (more: a tighter estimate, more model work)."""
SEED = 20_261_205


class Planned(Protocol):
    """What the statement needs of a planned query (a `Query`)."""

    def plan(self) -> PhysicalCandidate: ...

    def explain(self, verbose: bool = False, analyze: bool = False) -> str: ...

    def run(self) -> QueryResult: ...


Planner = Callable[[QuerySpec, OrderRule | None], Planned]


@dataclass(frozen=True)
class Pairs:
    """The blocked pairs (distinct texts of `{0}` and `{1}`) and what choosing them took."""

    table: pa.Table
    left_texts: int
    right_texts: int
    seconds: float
    outside: Callable[[int], pa.Table]
    """Up to n pairs not in `table`, drawn at random (the same draw every time)."""

    @property
    def before(self) -> int:
        return self.left_texts * self.right_texts

    @property
    def after(self) -> int:
        return self.table.num_rows


class BlockedQuery:
    """A statement whose AI join is blocked by similarity: explain(), plan(), run(), collect() as a `Query`."""

    def __init__(self, session: Session, planner: Planner, parsed: ParsedStatement, text: str, dialect: Dialect,
                 order: OrderRule | None = None) -> None:
        located = blocked_joins(parsed.statement)
        if len(located) != 1:
            raise CompileError(f"a statement may block one AI join; this one blocks {len(located)}")
        self.session = session
        blocked = located[0][1]
        anchor = _unblocked_anchor(planner, parsed, text, dialect, order, blocked, session)
        self.blocked = replace(blocked, condition=anchored(blocked.condition, anchor))
        self.name = f"__quail_pairs_{uuid.uuid4().hex[:8]}"
        self.statement = without_blocking(parsed.statement, self.name, self.blocked.condition)
        self.dialect = dialect
        with session.database.registered({self.name: PAIRS.empty_table()}):
            spec = read_parsed(replace(parsed, statement=self.statement), text, session.database, dialect)
            planner(spec, order)  # compiled here: a wrong name or type is a CompileError before any model work
        self._planner, self._spec, self._order = planner, spec, order
        self._pairs: tuple[int, Pairs] | None = None

    def pairs(self) -> Pairs:
        """The blocked pairs of the tables as they are now (embedding their texts the first time; stored vectors
        make it cheap again after a table changes)."""
        generation = self.session.database.generation
        if self._pairs is None or self._pairs[0] != generation:
            self._pairs = (generation, block(self.session, self.blocked, self.name))
        return self._pairs[1]

    @contextmanager
    def _registered(self) -> Iterator[Planned]:
        pairs = self.pairs()
        with self.session.database.registered({self.name: pairs.table}):
            yield self._planner(self._spec, self._order)

    def plan(self) -> PhysicalCandidate:
        with self._registered() as query:
            return query.plan()

    def explain(self, verbose: bool = False, analyze: bool = False) -> str:
        if analyze:
            return self.run().explain()
        with self._registered() as query:
            shown = query.explain(verbose)
        return "\n".join([*_described(self.blocked, self.pairs(), None), shown])

    def run(self) -> QueryResult:
        self.session.check_open()
        started = time.perf_counter()
        with self._registered() as query:
            result = query.run()
        pairs = self.pairs()
        recall = estimate_recall(self.session, self._planner, self.blocked, pairs, result, self.dialect)
        lines = _described(self.blocked, pairs, recall)
        report = replace(result.query_report, remarks=(*lines, *result.query_report.remarks),
                         wall_s=time.perf_counter() - started, blocking=recall.report(pairs))
        return QueryResult(result.collect(), result.answer_tables, report, "\n".join([*lines, result.explain()]))

    def collect(self) -> pa.Table:
        return self.run().collect()


def _unblocked_anchor(planner: Planner, parsed: ParsedStatement, text: str, dialect: Dialect,
                      order: OrderRule | None, blocked: BlockedJoin, session: Session) -> str:
    """The anchor the planner gives the join without blocking (planned, not run): the blocked join keeps it, so the
    same pair gets the same prompt — and the same answer — blocked or not."""
    spec = read_parsed(replace(parsed, statement=unblocked(parsed.statement)), text, session.database, dialect)
    graph = planner(spec, order).plan().graph
    template = blocked_template(blocked)
    for node in graph.nodes:
        if isinstance(node, ph.AiJoin) and node.predicate.prompt.template == template:
            return node.anchor.alias
    return blocked.left.table


def blocked_template(blocked: BlockedJoin) -> str:
    call = ai_call(blocked.condition.copy())
    assert call is not None and isinstance(call.arguments[0], exp.Anonymous)
    return str(call.arguments[0].expressions[0].this)


def block(session: Session, blocked: BlockedJoin, name: str) -> Pairs:
    """Each `{0}` text's nearest `{1}` texts by the cosine of their embeddings."""
    started = time.perf_counter()
    left = _embedded(session, blocked, blocked.left, blocked.left_table, f"{name}_left")
    right = _embedded(session, blocked, blocked.right, blocked.right_table, f"{name}_right")
    left_texts, left_vectors = _texts_and_vectors(left.collect())
    right_texts, right_vectors = _texts_and_vectors(right.collect())
    chosen = nearest(left_vectors, right_vectors, blocked.k, blocked.similarity)
    table = pa.table({LEFT: [left_texts[i] for i, _ in chosen], RIGHT: [right_texts[j] for _, j in chosen]},
                     schema=PAIRS)
    kept = {(i, j) for i, j in chosen}

    def outside(count: int) -> pa.Table:
        rng = np.random.default_rng(SEED)
        total = len(left_texts) * len(right_texts)
        drawn: list[tuple[int, int]] = []
        for flat in rng.permutation(total)[: count + len(kept)]:
            i, j = divmod(int(flat), len(right_texts))
            if (i, j) not in kept:
                drawn.append((i, j))
            if len(drawn) == count:
                break
        return pa.table({LEFT: [left_texts[i] for i, _ in drawn], RIGHT: [right_texts[j] for _, j in drawn]},
                        schema=PAIRS)

    return Pairs(table, len(left_texts), len(right_texts), time.perf_counter() - started, outside)


def nearest(left: np.ndarray, right: np.ndarray, k: int | None, similarity: float | None) -> list[tuple[int, int]]:
    """(left index, right index) of every kept pair: each left vector's `k` highest inner products with the right
    vectors (ties to the earlier), or every pair at or above `similarity`. The vectors are unit length, so the inner
    product is the cosine; faiss's flat index searches exactly."""
    import faiss

    if len(left) == 0 or len(right) == 0:
        return []
    index = faiss.IndexFlatIP(right.shape[1])
    index.add(np.ascontiguousarray(right, np.float32))
    queries = np.ascontiguousarray(left, np.float32)
    if k is not None:
        _, found = index.search(queries, min(k, len(right)))
        return [(i, int(j)) for i, row in enumerate(found) for j in row if j >= 0]
    assert similarity is not None
    limits, _, found = index.range_search(queries, float(np.nextafter(np.float32(similarity), np.float32(-2))))
    return [(i, int(found[p])) for i in range(len(left)) for p in range(limits[i], limits[i + 1])]


@dataclass(frozen=True)
class Recall:
    """The estimate from the sample: blocked pairs the model said TRUE, sampled outside pairs it said TRUE."""

    inside_true: int
    sampled: int
    sampled_true: int
    outside: int

    @property
    def missed(self) -> float:
        return self.sampled_true / self.sampled * self.outside if self.sampled else 0.0

    @property
    def estimate(self) -> float | None:
        found = self.inside_true + self.missed
        return None if found == 0 else self.inside_true / found

    def report(self, pairs: Pairs) -> BlockingReport:
        return BlockingReport(pairs.before, pairs.after, self.sampled, self.sampled_true, self.inside_true,
                              self.estimate)

    def describe(self) -> str:
        if self.estimate is None:
            return "estimated recall: no pair holds, inside the blocks or in the sample outside them"
        margin = 1.96 * math.sqrt(max(self.sampled_true, 1) * (self.sampled - self.sampled_true) /
                                  max(self.sampled, 1) ** 3) * self.outside if self.sampled else 0.0
        low = self.inside_true / (self.inside_true + self.missed + margin) if self.inside_true else 0.0
        return (f"estimated recall {self.estimate:.3f} (≥ {low:.3f} at 95 %): {self.sampled_true} of {self.sampled} "
                f"sampled pairs outside the blocks hold, so about {self.missed:,.0f} of the {self.outside:,} left out "
                f"would; {self.inside_true:,} held inside")


def estimate_recall(session: Session, planner: Planner, blocked: BlockedJoin, pairs: Pairs, result: QueryResult,
                    dialect: Dialect) -> Recall:
    """The sampled pairs outside the blocks judged by the same join prompt (a statement of the two tables joined
    through the sample), beside the TRUE answers of the blocked join."""
    outside = pairs.before - pairs.after
    sample = pairs.outside(min(RECALL_SAMPLE, outside))
    inside_true = sum(int(pc.sum(table.column("answer")).as_py() or 0) for node, table in result.answer_tables.items()
                      if "answer" in table.column_names and "join" in node)
    if sample.num_rows == 0:
        return Recall(inside_true, 0, 0, outside)
    name = f"__quail_sample_{uuid.uuid4().hex[:8]}"
    statement = _sample_statement(blocked, name)
    with session.database.registered({name: sample}):
        parsed = ParsedStatement(statement)
        spec = read_parsed(parsed, statement.sql(dialect=dialect), session.database, dialect)
        judged = planner(spec, None).run()
    return Recall(inside_true, sample.num_rows, judged.count(), outside)


def _sample_statement(blocked: BlockedJoin, pairs: str) -> exp.Select:
    """SELECT 1 FROM <{0}'s table> JOIN pairs ON … JOIN <{1}'s table> ON … AND <the call>: the join over a sample of
    pairs, asked with the blocked join's own prompt."""
    on_left = exp.EQ(this=exp.column(LEFT, table=PAIRS_ALIAS), expression=blocked.left.copy())
    on_right = exp.and_(exp.EQ(this=blocked.right.copy(), expression=exp.column(RIGHT, table=PAIRS_ALIAS)),
                        blocked.condition.copy())
    return (exp.select(exp.Literal.number(1)).from_(blocked.left_table.copy())
            .join(pairs_relation(pairs), on=on_left)
            .join(blocked.right_table.copy(), on=on_right))


def _embedded(session: Session, blocked: BlockedJoin, column: exp.Column, table: exp.Expression,
              name: str) -> QueryResult:
    """The distinct texts of one document and their vectors (an embedding lookup over its table)."""
    distinct = exp.select(exp.alias_(exp.cast(column.copy(), "VARCHAR"), "doc0")).distinct().from_(table.copy())
    derived = exp.Subquery(this=distinct, alias=exp.TableAlias(this=exp.to_identifier(LOOKUP_ALIAS)))
    arguments: list[exp.Expression] = [exp.column("doc0", table=LOOKUP_ALIAS)]
    if blocked.model is not None:
        arguments.append(exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(MODEL_OPTION),
                                                                expression=exp.Literal.string(blocked.model))]))
    call = exp.Anonymous(this="AI_EMBED", expressions=arguments)
    inner = exp.select(exp.column("doc0", table=LOOKUP_ALIAS), exp.alias_(call, VALUE)).from_(derived)
    lookup = Lookup(name, "embed", EMBEDDING, inner, 1, f"AI_EMBED({column.sql()})", table.sql(), ())
    return EmbeddingQuery(session, lookup).run()


def _texts_and_vectors(table: pa.Table) -> tuple[list[str], np.ndarray]:
    texts = table.column("doc0").to_pylist()
    vectors = table.column(VALUE).to_pylist()
    dimensions = len(vectors[0]) if vectors else 0
    return texts, np.asarray(vectors, np.float32).reshape(len(vectors), dimensions)


def _described(blocked: BlockedJoin, pairs: Pairs, recall: Recall | None) -> list[str]:
    lines = [f"similarity blocking of {blocked.call}: {blocked.describe()} — {pairs.before:,} pairs of distinct "
             f"texts ({pairs.left_texts:,} × {pairs.right_texts:,}) → {pairs.after:,} asked "
             f"({pairs.before / max(pairs.after, 1):.1f}× fewer; embeddings and search {pairs.seconds:.2f} s)"]
    if recall is None:
        lines.append("estimated recall: measured when the query runs, on a sample of the pairs left out")
    else:
        lines.append(recall.describe())
    return lines
