"""Join order and anchors: left-deep dynamic programming over (joined aliases, anchored aliases).

A join step adds one alias; the AI predicate completed by that alias is evaluated anchored on
one of its aliases: each anchor document's prefix (+ frame) is computed once — or reused when
its KV is already resident — and every candidate tuple asks only its partner suffix. Step cost
depends only on (joined set, new alias, anchor, whether the anchor's KV is reusable), so the DP
over subsets, keeping for each subset the candidates not dominated on (cost, reusable anchors),
finds the same optimum as enumerating every left-deep order × anchor.

The DP visits every subset of the aliases, so its time grows about threefold per alias. Beyond
`EXHAUSTIVE_JOIN_LIMIT` aliases a greedy search takes over — from every starting alias, add the
connected alias whose step is cheapest — and the plan says which search chose it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Literal

from quail.logical.expressions import Semantics
from quail.planner.cost import CostModel, Lengths, Work, ask, scan

EXHAUSTIVE_JOIN_LIMIT = 8
"""The most aliases the exact DP searches: 8 plan in well under 0.1 s, 14 took two minutes."""

JoinSearch = Literal["exhaustive", "greedy"]


@dataclass(frozen=True)
class AliasStats:
    """An alias after its filters: expected surviving documents, and whether their KV is kept."""

    alias: str
    documents: Lengths
    kv_retained: bool = False


@dataclass(frozen=True)
class AnchorLayout:
    """Token counts of a join prompt anchored on one alias (preamble, frame, labels, cue)."""

    preamble: int
    frame: int
    labels: Mapping[str, int]
    cue: int


@dataclass(frozen=True)
class JoinEdge:
    """An AI join predicate: its aliases, selectivity, and layout per feasible anchor."""

    position: int
    aliases: tuple[str, ...]
    selectivity: float
    layouts: Mapping[str, AnchorLayout]
    semantics: Semantics = "full"


@dataclass(frozen=True)
class EqualityEdge:
    """Column equalities between two aliases keep this fraction of candidate pairs."""

    aliases: tuple[str, str]
    fraction: float


@dataclass(frozen=True)
class Step:
    alias: str
    edge: int | None
    anchor: str | None
    seconds: float
    candidates: float
    tuples_after: float
    work: Work


@dataclass(frozen=True)
class JoinPlan:
    order: tuple[str, ...]
    steps: tuple[Step, ...]
    seconds: float
    tuples: float
    search: JoinSearch = "exhaustive"

    @property
    def anchors(self) -> dict[int, str]:
        return {s.edge: s.anchor for s in self.steps if s.edge is not None and s.anchor is not None}


@dataclass(frozen=True)
class JoinProblem:
    stats: Mapping[str, AliasStats]
    edges: tuple[JoinEdge, ...]
    equalities: tuple[EqualityEdge, ...]
    cost: CostModel

    def completing(self, joined: frozenset[str], alias: str) -> list[JoinEdge]:
        now = joined | {alias}
        return [e for e in self.edges if alias in e.aliases and set(e.aliases) <= now]

    def pair_fraction(self, joined: frozenset[str], alias: str) -> float:
        fraction = 1.0
        for equality in self.equalities:
            if alias in equality.aliases and set(equality.aliases) - {alias} <= joined:
                fraction *= equality.fraction
        return fraction

    def tuples(self, joined: frozenset[str]) -> float:
        """Expected tuples of a joined set: independent of the order that built it."""
        count = 1.0
        for alias in joined:
            count *= self.stats[alias].documents.count
        for equality in self.equalities:
            if set(equality.aliases) <= joined:
                count *= equality.fraction
        for edge in self.edges:
            if set(edge.aliases) <= joined:
                count *= edge.selectivity
        return count

    def step(self, joined: frozenset[str], alias: str, anchor: str | None, anchored: frozenset[str]) -> Step | None:
        """One join step, or None when it is infeasible (two predicates at once, too long)."""
        edges = self.completing(joined, alias)
        candidates = self.tuples(joined) * self.stats[alias].documents.count * self.pair_fraction(joined, alias)
        if not edges:
            return Step(alias, None, None, 0.0, candidates, candidates, Work()) if anchor is None else None
        if len(edges) > 1 or anchor is None or anchor not in edges[0].layouts:
            return None
        edge = edges[0]
        work = self.anchored_work(edge, anchor, joined, alias, candidates, anchored)
        if work is None:
            return None
        seconds = self.cost.seconds(work[0]) + self.cost.seconds(work[1])
        return Step(alias, edge.position, anchor, seconds, candidates, candidates * edge.selectivity,
                    work[0] + work[1])

    def anchored_work(self, edge: JoinEdge, anchor: str, joined: frozenset[str], alias: str, candidates: float,
                      anchored: frozenset[str]) -> tuple[Work, Work] | None:
        layout = edge.layouts[anchor]
        documents = self.stats[anchor].documents
        distinct = documents.count if anchor == alias else min(documents.count, self.tuples(joined))
        fraction = distinct / documents.count if documents.count else 0.0
        prefix = documents.plus(layout.preamble).scaled(fraction)
        suffix = self.suffix(edge, anchor, layout, candidates)
        if prefix.maximum + layout.frame + suffix.maximum > self.cost.chunk_tokens:
            return None
        if self.reusable(anchor, anchored):
            frames = Lengths(prefix.count, prefix.count * layout.frame, prefix.count * layout.frame ** 2, layout.frame)
            prefix_work = ask(prefix, frames, answers=False)
        else:
            prefix_work = scan(prefix.plus(layout.frame), answers=False)
        return prefix_work, ask(prefix.plus(layout.frame), suffix)

    def longest_prompt(self, edge: JoinEdge, anchor: str) -> float:
        """Tokens of the worst tuple anchored on `anchor`: it must fit one forward chunk."""
        layout = edge.layouts[anchor]
        documents = self.stats[anchor].documents
        return documents.maximum + layout.preamble + layout.frame + self.suffix(edge, anchor, layout, 1.0).maximum

    def connected(self, joined: frozenset[str], alias: str) -> bool:
        """Whether a predicate or an equality links `alias` to the joined set (else the step is a cross product)."""
        links = [*(e.aliases for e in self.edges), *(e.aliases for e in self.equalities)]
        return any(alias in link and set(link) & joined for link in links)

    def reusable(self, anchor: str, anchored: frozenset[str]) -> bool:
        return anchor in anchored or self.stats[anchor].kv_retained

    def suffix(self, edge: JoinEdge, anchor: str, layout: AnchorLayout, candidates: float) -> Lengths:
        """[label][partner document] per partner, then the cue: mean and mean square per tuple."""
        mean, variance, maximum = float(layout.cue), 0.0, float(layout.cue)
        for partner in edge.aliases:
            if partner == anchor:
                continue
            docs = self.stats[partner].documents
            mean += layout.labels[partner] + docs.mean
            variance += max(docs.mean_square - docs.mean ** 2, 0.0)
            maximum += layout.labels[partner] + docs.maximum
        return Lengths(candidates, candidates * mean, candidates * (variance + mean * mean), maximum)


@dataclass(frozen=True)
class _Partial:
    seconds: float
    anchored: frozenset[str]
    steps: tuple[Step, ...]


def plan_joins(problem: JoinProblem, aliases: Sequence[str],
               exhaustive_limit: int = EXHAUSTIVE_JOIN_LIMIT) -> JoinPlan | None:
    """The cheapest feasible left-deep order × anchors over `aliases`, or None if none is feasible.

    Exact up to `exhaustive_limit` aliases; greedy beyond (`JoinPlan.search` says which).
    """
    if len(aliases) > exhaustive_limit:
        best, search = _greedy(problem, aliases), "greedy"
    else:
        best, search = _exhaustive(problem, aliases), "exhaustive"
    if best is None:
        return None
    order = tuple(s.alias for s in best.steps)
    return JoinPlan(order, best.steps[1:], best.seconds, problem.tuples(frozenset(aliases)), search)


def _start(alias: str) -> _Partial:
    return _Partial(0.0, frozenset(), (Step(alias, None, None, 0.0, 0.0, 0.0, Work()),))


def _exhaustive(problem: JoinProblem, aliases: Sequence[str]) -> _Partial | None:
    table: dict[frozenset[str], list[_Partial]] = {frozenset([a]): [_start(a)] for a in aliases}
    for size in range(2, len(aliases) + 1):
        for subset in combinations(aliases, size):
            joined = frozenset(subset)
            table[joined] = _pareto(_extensions(problem, joined, table))
    return min(table.get(frozenset(aliases), []), key=lambda p: p.seconds, default=None)


def _greedy(problem: JoinProblem, aliases: Sequence[str]) -> _Partial | None:
    """From each starting alias, add the linked alias (any, if none is linked) whose step is cheapest."""
    finished = [p for p in (_greedy_from(problem, aliases, a) for a in aliases) if p is not None]
    return min(finished, key=lambda p: p.seconds, default=None)


def _greedy_from(problem: JoinProblem, aliases: Sequence[str], first: str) -> _Partial | None:
    partial, joined = _start(first), frozenset([first])
    while len(joined) < len(aliases):
        rest = [a for a in aliases if a not in joined]
        linked = [a for a in rest if problem.connected(joined, a)] or rest
        options = [c for alias in linked for c in _extend(problem, joined, partial, alias)]
        if not options:
            return None
        partial = min(options, key=lambda c: (c.seconds - partial.seconds, c.steps[-1].tuples_after))
        joined = joined | {partial.steps[-1].alias}
    return partial


def _extensions(problem: JoinProblem, joined: frozenset[str], table: dict[frozenset[str], list[_Partial]]
                ) -> list[_Partial]:
    found = []
    for alias in sorted(joined):
        before = joined - {alias}
        for partial in table.get(before, []):
            found.extend(_extend(problem, before, partial, alias))
    return found


def _extend(problem: JoinProblem, joined: frozenset[str], partial: _Partial, alias: str) -> list[_Partial]:
    """`partial` (over `joined`) followed by a step adding `alias`, once per feasible anchor."""
    found = []
    for anchor in _anchor_choices(problem, joined, alias):
        step = problem.step(joined, alias, anchor, partial.anchored)
        if step is None:
            continue
        anchored = partial.anchored | ({anchor} if anchor else set())
        found.append(_Partial(partial.seconds + step.seconds, anchored, (*partial.steps, step)))
    return found


def _anchor_choices(problem: JoinProblem, joined: frozenset[str], alias: str) -> list[str | None]:
    edges = problem.completing(joined, alias)
    if len(edges) != 1:
        return [None]
    return sorted(edges[0].layouts)


def _pareto(candidates: list[_Partial]) -> list[_Partial]:
    """Drop candidates that cost more and can reuse no anchor KV that a cheaper one cannot."""
    kept: list[_Partial] = []
    for candidate in sorted(candidates, key=lambda c: (c.seconds, -len(c.anchored))):
        if not any(k.seconds <= candidate.seconds and candidate.anchored <= k.anchored for k in kept):
            kept.append(candidate)
    return kept


def sequence_cost(problem: JoinProblem, order: Sequence[str], anchors: Mapping[int, str]) -> float | None:
    """The cost of one given left-deep order and anchor choice (None when infeasible)."""
    joined, anchored, total = frozenset([order[0]]), frozenset[str](), 0.0
    for alias in order[1:]:
        edges = problem.completing(joined, alias)
        anchor = anchors.get(edges[0].position) if len(edges) == 1 else None
        step = problem.step(joined, alias, anchor, anchored)
        if step is None:
            return None
        total += step.seconds
        anchored = anchored | ({anchor} if anchor else set())
        joined = joined | {alias}
    return total
