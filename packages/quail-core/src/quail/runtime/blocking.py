"""Running a blocked AI join (`quail.frontend.blocking`): the pairs chosen by embeddings, then the statement.

Each of the join's two documents has its distinct texts embedded (an `EmbeddingQuery` each: stored, never computed
twice); a flat inner-product index over the `{1}` texts' unit vectors gives every `{0}` text its nearest partners
(exact: on the sizes a model can judge, an exhaustive search is milliseconds — see docs/embeddings.md); the pairs are
registered as a relation and the rewritten statement is planned by the ordinary planner, which asks the model only
about them. After the run, a sample of the pairs left out is judged with the same prompt, so the report estimates
what the blocking missed (recall) from measurement, not assumption. `explain()` estimates it before the run the same
way from a pilot — a sample of the kept pairs and the same sample of the left-out ones, judged while explaining and
kept by the answer store, so the run that follows asks none of them again.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
from sqlglot import exp

from quail.backends.base import OrderRule, PhysicalCandidate
from quail.cache.access import store_location
from quail.compute.request import NodeMetrics
from quail.errors import CompileError, Refusal, RefusalError
from quail.frontend.blocking import (
    LEFT,
    MAX_THRESHOLD_PAIRS,
    RIGHT,
    BlockedJoin,
    PairsRelation,
    anchored,
    blocked_joins,
    unblocked,
    without_blocking,
)
from quail.frontend.calls import MODEL_OPTION
from quail.frontend.lookups import LOOKUP_ALIAS, VALUE, Lookup
from quail.frontend.spec import QuerySpec
from quail.frontend.sql import Dialect, ParsedStatement, read_parsed
from quail.frontend.syntax import EMBEDDING, ai_call
from quail.physical import nodes as ph
from quail.runtime.coordinator import Query, QuerySession
from quail.runtime.embeddings import TEXT, EmbeddingQuery
from quail.runtime.report import BlockingReport
from quail.runtime.results import QueryResult

PAIRS = pa.schema([pa.field(LEFT, pa.string()), pa.field(RIGHT, pa.string())])
RECALL_SAMPLE = 32
"""Pairs outside the blocks judged after the run to estimate the recall (more: a tighter estimate, more model work)."""
SEED = 20_261_205


Planner = Callable[[QuerySpec, OrderRule | None], Query]
"""The session's way from a query spec to a planned query of one block."""


@dataclass(frozen=True)
class Pairs:
    """The blocked pairs (distinct texts of `{0}` and `{1}`) and what choosing them took."""

    table: pa.Table
    left_texts: int
    right_texts: int
    seconds: float
    outside: Callable[[int], pa.Table]
    """Up to n pairs not in `table`, drawn at random (the same draw every time)."""
    inside: Callable[[int], pa.Table]
    """Up to n pairs of `table`, drawn at random without repeats (the same draw every time)."""
    work: Mapping[str, NodeMetrics]
    """The embedding runs' node metrics (`blocking/left/...`, `blocking/right/...`), for the report."""

    @property
    def before(self) -> int:
        return self.left_texts * self.right_texts

    @property
    def after(self) -> int:
        return self.table.num_rows


class BlockedQuery:
    """A statement whose AI join is blocked by similarity: explain(), plan(), run(), collect() as a `Query`."""

    def __init__(self, session: QuerySession, planner: Planner, parsed: ParsedStatement, text: str,
                 dialect: Dialect, order: OrderRule | None = None) -> None:
        located = blocked_joins(parsed.statement)
        if len(located) != 1:
            raise CompileError(f"a statement may block one AI join; this one blocks {len(located)}")
        self.session = session
        self.blocked = located[0][1]
        self.pairs_relation = PairsRelation(f"__quail_pairs_{uuid.uuid4().hex[:8]}")
        self.name = self.pairs_relation.name
        self.dialect = dialect
        self._planner, self._parsed, self._text, self._order = planner, parsed, text, order
        self._spec(self.blocked.condition)  # compiled now: a wrong name or type is a CompileError before model work
        self._anchored: tuple[BlockedJoin, QuerySpec] | None = None
        self._pairs: tuple[int, Pairs] | None = None

    def _spec(self, condition: exp.Expression) -> QuerySpec:
        """The statement reading the pairs relation, its call `condition`, read (and compiled) by the planner."""
        statement = without_blocking(self._parsed.statement, self.pairs_relation, condition)
        with self.session.database.registered({self.name: PAIRS.empty_table()}):
            spec = read_parsed(replace(self._parsed, statement=statement), self._text, self.session.database,
                               self.dialect)
            self._planner(spec, self._order)
        return spec

    def anchored(self) -> tuple[BlockedJoin, QuerySpec]:
        """The blocked join with the anchor the unblocked join would get, and the statement's spec with it (planned
        the first time it is needed, not when the query is made)."""
        if self._anchored is None:
            anchor = _unblocked_anchor(self._planner, self._parsed, self._text, self.dialect, self._order,
                                       self.blocked, self.session)
            blocked = replace(self.blocked, condition=anchored(self.blocked.condition, anchor))
            self._anchored = (blocked, self._spec(blocked.condition))
        return self._anchored

    def pairs(self) -> Pairs:
        """The blocked pairs of the tables as they are now (embedding their texts the first time; stored vectors
        make it cheap again after a table changes)."""
        generation = self.session.database.generation
        if self._pairs is None or self._pairs[0] != generation:
            self._pairs = (generation, block(self.session, self.blocked, self.name))
        return self._pairs[1]

    @contextmanager
    def _registered(self) -> Iterator[Query]:
        pairs = self.pairs()
        _, spec = self.anchored()
        with self.session.database.registered({self.name: pairs.table}):
            yield self._planner(spec, self._order)

    def plan(self) -> PhysicalCandidate:
        with self._registered() as query:
            return query.plan()

    def explain(self, verbose: bool = False, analyze: bool = False) -> str:
        if analyze:
            return self.run().explain()
        with self._registered() as query:
            shown = query.explain(verbose)
        pairs = self.pairs()
        pilot = pilot_recall(self.session, self._planner, self.anchored()[0], pairs, self.dialect)
        return "\n".join([*_described(self.blocked, pairs, pilot.describe()), shown])

    def run(self) -> QueryResult:
        self.session.check_open()
        started = time.perf_counter()
        blocked, _ = self.anchored()
        with self._registered() as query:
            result = query.run()
            asked = asked_pairs(query, result, blocked)
        pairs = self.pairs()
        recall = estimate_recall(self.session, self._planner, blocked, pairs, asked, self.dialect)
        lines = _described(self.blocked, pairs, recall.describe())
        report = replace(result.query_report, remarks=(*lines, *result.query_report.remarks),
                         wall_s=time.perf_counter() - started, blocking=recall.report(pairs),
                         node_metrics={**result.query_report.node_metrics, **pairs.work, **recall.work})
        return QueryResult(result.collect(), result.answer_tables, report, "\n".join([*lines, result.explain()]))

    def collect(self) -> pa.Table:
        return self.run().collect()


def _unblocked_anchor(planner: Planner, parsed: ParsedStatement, text: str, dialect: Dialect,
                      order: OrderRule | None, blocked: BlockedJoin, session: QuerySession) -> str:
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


def block(session: QuerySession, blocked: BlockedJoin, name: str) -> Pairs:
    """Each `{0}` text's nearest `{1}` texts by the cosine of their embeddings (over the rows the statement's own
    conditions on each table keep)."""
    started = time.perf_counter()
    left = _embedded(session, blocked, blocked.left, blocked.left_table, blocked.left_conditions, f"{name}_left")
    right = _embedded(session, blocked, blocked.right, blocked.right_table, blocked.right_conditions,
                      f"{name}_right")
    left_texts, left_vectors = _texts_and_vectors(left.collect())
    right_texts, right_vectors = _texts_and_vectors(right.collect())
    chosen = nearest(left_vectors, right_vectors, blocked.k, blocked.similarity)
    table = pa.table({LEFT: [left_texts[i] for i, _ in chosen], RIGHT: [right_texts[j] for _, j in chosen]},
                     schema=PAIRS)
    kept = set(chosen)

    def outside(count: int) -> pa.Table:
        """Pairs drawn uniformly until `count` lie outside the blocks (the caller asks for no more than there are)."""
        rng = np.random.default_rng(SEED)
        drawn: dict[tuple[int, int], None] = {}
        while len(drawn) < count:
            pair = (int(rng.integers(len(left_texts))), int(rng.integers(len(right_texts))))
            if pair not in kept:
                drawn[pair] = None
        return pa.table({LEFT: [left_texts[i] for i, _ in drawn], RIGHT: [right_texts[j] for _, j in drawn]},
                        schema=PAIRS)

    def inside(count: int) -> pa.Table:
        """`count` kept pairs drawn without repeats (the same draw every time), in the table's order."""
        drawn = np.random.default_rng(SEED).permutation(table.num_rows)[:count]
        return table.take(pa.array(np.sort(drawn), pa.int64()))

    work = {f"blocking/{side}/{node}": metrics for side, result in (("left", left), ("right", right))
            for node, metrics in result.query_report.node_metrics.items()}
    return Pairs(table, len(left_texts), len(right_texts), time.perf_counter() - started, outside, inside, work)


def nearest(left: np.ndarray, right: np.ndarray, k: int | None, similarity: float | None) -> list[tuple[int, int]]:
    """(left index, right index) of every kept pair: each left vector's `k` highest inner products with the right
    vectors, or every pair at or above `similarity`. The vectors are unit length, so the inner product is the
    cosine; faiss's flat index searches exactly (docs/embeddings.md: an approximate index needs so wide a search
    for recall 0.99 that it does not pay at the sizes measured here)."""
    import faiss

    if len(left) == 0 or len(right) == 0:
        return []
    index = faiss.IndexFlatIP(right.shape[1])
    index.add(np.ascontiguousarray(right, np.float32))
    queries = np.ascontiguousarray(left, np.float32)
    if k is not None:
        _, found = index.search(queries, min(k, len(right)))
        rows = np.repeat(np.arange(len(left)), found.shape[1])
        columns = found.reshape(-1)
        present = columns >= 0
        return list(zip(rows[present].tolist(), columns[present].tolist(), strict=True))
    assert similarity is not None
    limits, _, found = index.range_search(queries, float(np.nextafter(np.float32(similarity), np.float32(-2))))
    if len(found) > MAX_THRESHOLD_PAIRS:
        raise RefusalError(Refusal(
            f"a similarity of {similarity:g} keeps {len(found):,} pairs, more than blocking asks "
            f"({MAX_THRESHOLD_PAIRS:,})", (f"{len(left):,} × {len(right):,} texts",),
            hints=("raise 'similarity', or keep each text's nearest with {'blocking': 'top_k', 'k': n}",)))
    rows = np.repeat(np.arange(len(left)), np.diff(limits.astype(np.int64)))
    return list(zip(rows.tolist(), found.astype(np.int64).tolist(), strict=True))


@dataclass(frozen=True)
class Recall:
    """The recall of the blocks, estimated over pairs of distinct texts: of the `kept` pairs, `inside` judged and
    `inside_true` of them held (after a run: every kept pair, the run's own answers; before it, a pilot's sample);
    of a uniform sample of the `outside` pairs left out, `sampled` judged and `sampled_true` held. None where the run
    did not ask every kept pair (a LIMIT stopped it, or a condition between the tables removed some): the counts
    would then measure different things."""

    inside: int
    inside_true: int
    kept: int
    sampled: int
    sampled_true: int
    outside: int
    asked_all: bool = True
    before_run: bool = False
    """A pilot's estimate (`explain()`), from a sample of the kept pairs judged before the run."""
    stored: bool = True
    """Whether the answer store keeps the judged pairs (a pilot's are then not asked again by the run)."""
    work: Mapping[str, NodeMetrics] = field(default_factory=dict)
    """The samples' node metrics (`blocking/sample/...`, `blocking/pilot_kept/...`, ...), for the report."""

    @property
    def missed(self) -> float:
        return self.sampled_true / self.sampled * self.outside if self.sampled else 0.0

    @property
    def estimate(self) -> float | None:
        """None also when a pilot saw no pair hold: it then says nothing of how many the blocks miss."""
        if not self.asked_all:
            return None
        if self.outside == 0:
            return 1.0
        if self.inside_true == 0 and self.sampled_true == 0:
            return None if self.inside < self.kept else 1.0
        return self._recall(_share(self.inside_true, self.inside), _share(self.sampled_true, self.sampled))

    def lower_bound(self) -> float | None:
        """At the high end of the Wilson 95 % interval of the left-out pairs' share that holds and — where only a
        sample of the kept pairs was judged — the low end of theirs (each end one-sided 97.5 %, so jointly ≥ 95 %)."""
        if self.estimate is None or self.outside == 0:
            return self.estimate
        inside = (_share(self.inside_true, self.inside) if self.inside == self.kept
                  else _wilson(self.inside_true, self.inside)[0])
        return self._recall(inside, _wilson(self.sampled_true, self.sampled)[1])

    def _recall(self, inside_share: float, outside_share: float) -> float:
        """The kept pairs expected to hold over those expected to hold anywhere."""
        held, missed = inside_share * self.kept, outside_share * self.outside
        return held / (held + missed) if held + missed else 1.0

    def report(self, pairs: Pairs) -> BlockingReport:
        return BlockingReport(pairs.before, pairs.after, self.sampled, self.sampled_true, self.inside_true,
                              self.estimate)

    def describe(self) -> str:
        """The remark: the estimate, its bound and the counts it comes from."""
        if not self.asked_all:
            return ("recall not estimated: the run did not ask every kept pair (a LIMIT or a condition between the "
                    "tables stopped it)")
        if self.before_run:
            return self._described_pilot()
        return (f"estimated recall {self.estimate:.3f} (≥ {self.lower_bound():.3f} at 95 %): {self.sampled_true} of "
                f"{self.sampled} sampled pairs outside the blocks hold, so about {self.missed:,.0f} of the "
                f"{self.outside:,} left out would; {self.inside_true:,} held inside")

    def _described_pilot(self) -> str:
        again = ("the answer store keeps them for the run" if self.stored
                 else "the run asks them again: the answer store is off")
        counts = (f"{self.inside_true} of {self.inside} sampled kept pairs and {self.sampled_true} of {self.sampled} "
                  f"left out hold — asked while explaining; {again}")
        if self.estimate is None:
            return f"estimated recall: no sampled pair holds, so the pilot cannot tell: {counts}"
        return f"estimated recall before the run {self.estimate:.3f} (≥ {self.lower_bound():.3f} at 95 %): {counts}"


def _share(held: int, asked: int) -> float:
    return held / asked if asked else 0.0


def _wilson(held: int, asked: int) -> tuple[float, float]:
    """The Wilson 95 % interval of a share `held` of `asked` (nothing asked: anything, (0, 1))."""
    if not asked:
        return 0.0, 1.0
    z, share = 1.96, held / asked
    middle = share + z * z / (2 * asked)
    spread = z * math.sqrt(share * (1 - share) / asked + z * z / (4 * asked * asked))
    scale = 1 + z * z / asked
    return (middle - spread) / scale, (middle + spread) / scale


@dataclass(frozen=True)
class Asked:
    """The distinct text pairs the blocked join asked, and those it said TRUE."""

    pairs: frozenset[tuple[str, str]]
    true: frozenset[tuple[str, str]]


def asked_pairs(query: Query, result: QueryResult, blocked: BlockedJoin) -> Asked:
    """The blocked join's own answers (its node found by its prompt) as pairs of the two documents' texts."""
    template = blocked_template(blocked)
    node = next(n for n in query.plan().graph.nodes
                if isinstance(n, ph.AiJoin) and n.predicate.prompt.template == template)
    table = result.answer_tables[node.id]
    views = query.prepared().views
    sides = []
    for column in (blocked.left, blocked.right):
        rows = table.column(column.table)
        sides.append(views[column.table].take(rows, [column.name]).column(column.name).cast(pa.string()).to_pylist())
    answers = table.column("answer").to_pylist()
    pairs = list(zip(sides[0], sides[1], strict=True))
    return Asked(frozenset(pairs), frozenset(p for p, holds in zip(pairs, answers, strict=True) if holds))


def estimate_recall(session: QuerySession, planner: Planner, blocked: BlockedJoin, pairs: Pairs, asked: Asked,
                    dialect: Dialect) -> Recall:
    """A uniform sample of the pairs left out, asked with the blocked join's own prompt (the two tables joined
    through the sample), beside the kept pairs the run said TRUE."""
    outside = pairs.before - pairs.after
    asked_all = len(asked.pairs) >= pairs.after
    sample = pairs.outside(min(RECALL_SAMPLE, outside) if asked_all else 0)
    kept = pairs.after
    if sample.num_rows == 0:
        return Recall(kept, len(asked.true), kept, 0, 0, outside, asked_all)
    holding, work = _judged(session, planner, blocked, sample, dialect, "sample")
    return Recall(kept, len(asked.true), kept, sample.num_rows, holding, outside, asked_all, work=work)


def _judged(session: QuerySession, planner: Planner, blocked: BlockedJoin, sample: pa.Table, dialect: Dialect,
            label: str) -> tuple[int, dict[str, NodeMetrics]]:
    """How many of the sampled pairs hold, asked with the blocked join's own prompt (the two tables joined through
    the sample), and the model work it took (`blocking/<label>/...`)."""
    relation = PairsRelation(f"__quail_{label}_{uuid.uuid4().hex[:8]}")
    statement = _sample_statement(blocked, relation)
    with session.database.registered({relation.name: sample}):
        spec = read_parsed(ParsedStatement(statement), statement.sql(dialect=dialect), session.database, dialect)
        judged = planner(spec, None).run()
    return judged.count(), {f"blocking/{label}/{node}": m for node, m in judged.query_report.node_metrics.items()}


def pilot_recall(session: QuerySession, planner: Planner, blocked: BlockedJoin, pairs: Pairs,
                 dialect: Dialect) -> Recall:
    """The recall estimated before the run from RECALL_SAMPLE kept pairs and the RECALL_SAMPLE left out that the
    run's own estimate asks, judged now (with the answer store on, the run asks none of them again)."""
    outside = pairs.before - pairs.after
    inside, left_out = pairs.inside(min(RECALL_SAMPLE, pairs.after)), pairs.outside(min(RECALL_SAMPLE, outside))
    inside_true, inside_work = (_judged(session, planner, blocked, inside, dialect, "pilot_kept")
                                if inside.num_rows else (0, {}))
    sampled_true, outside_work = (_judged(session, planner, blocked, left_out, dialect, "pilot_left_out")
                                  if left_out.num_rows else (0, {}))
    return Recall(inside.num_rows, inside_true, pairs.after, left_out.num_rows, sampled_true, outside,
                  before_run=True, stored=store_location(session.config) is not None,
                  work={**inside_work, **outside_work})


def _sample_statement(blocked: BlockedJoin, pairs: PairsRelation) -> exp.Select:
    """SELECT DISTINCT <the pair's texts> FROM <{0}'s table> JOIN pairs ON … JOIN <{1}'s table> ON … AND <the call>:
    each sampled pair of texts that holds, once, asked with the blocked join's own prompt."""
    on_left = exp.EQ(this=pairs.column(LEFT), expression=blocked.left.copy())
    on_right = exp.and_(exp.EQ(this=blocked.right.copy(), expression=pairs.column(RIGHT)), blocked.condition.copy())
    return (exp.select(pairs.column(LEFT), pairs.column(RIGHT)).distinct().from_(blocked.left_table.copy())
            .join(pairs.table(), on=on_left)
            .join(blocked.right_table.copy(), on=on_right))


def _embedded(session: QuerySession, blocked: BlockedJoin, column: exp.Column, table: exp.Expression,
              conditions: tuple[exp.Expression, ...], name: str) -> QueryResult:
    """The distinct texts of one document (over the rows its table's own conditions keep) and their vectors: an
    embedding lookup over its table."""
    distinct = exp.select(exp.alias_(exp.cast(column.copy(), "VARCHAR"), TEXT)).distinct().from_(table.copy())
    if conditions:
        distinct = distinct.where(exp.and_(*(c.copy() for c in conditions)))
    derived = exp.Subquery(this=distinct, alias=exp.TableAlias(this=exp.to_identifier(LOOKUP_ALIAS)))
    arguments: list[exp.Expression] = [exp.column(TEXT, table=LOOKUP_ALIAS)]
    if blocked.model is not None:
        arguments.append(exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(MODEL_OPTION),
                                                                expression=exp.Literal.string(blocked.model))]))
    call = exp.Anonymous(this="AI_EMBED", expressions=arguments)
    inner = exp.select(exp.column(TEXT, table=LOOKUP_ALIAS), exp.alias_(call, VALUE)).from_(derived)
    lookup = Lookup(name, "embed", EMBEDDING, inner, 1, f"AI_EMBED({column.sql()})", table.sql(), ())
    return EmbeddingQuery(session, lookup).run()


def _texts_and_vectors(table: pa.Table) -> tuple[list[str], np.ndarray]:
    texts = table.column(TEXT).to_pylist()
    vectors = table.column(VALUE).to_pylist()
    dimensions = len(vectors[0]) if vectors else 0
    return texts, np.asarray(vectors, np.float32).reshape(len(vectors), dimensions)


def _described(blocked: BlockedJoin, pairs: Pairs, recall: str) -> list[str]:
    return [f"similarity blocking of {blocked.call}: {blocked.describe()} — {pairs.before:,} pairs of distinct "
            f"texts ({pairs.left_texts:,} × {pairs.right_texts:,}) → {pairs.after:,} asked "
            f"({pairs.before / max(pairs.after, 1):.1f}× fewer; embeddings and search {pairs.seconds:.2f} s)", recall]
