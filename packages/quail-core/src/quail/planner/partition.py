"""Splitting a query's model work over workers: which documents each worker answers for.

The planner's half of scale-out; a compute provider only runs what this decides. Model work is cut
into phases. A phase answers a group of model nodes keyed on one alias — a filter, classification or
score by the alias it reads, a join by its anchor — and each worker receives a shard of that alias's
documents: the alias's Scan restricted to the shard, the answers of earlier phases given. Every
answer of a filter, classification or score belongs to one document and every answer of a join to
one anchor, so the shards' answers are disjoint and together they are the unsplit plan's answers;
the coordinator merges them and runs the relational part over whole tables.

* Phases are levelled as late as possible: a node joins the phase of the later nodes on its key, so
  a filter and the join anchored on its survivors run in one request on one worker (the survivors'
  KV stays where it was computed), and a partner's filter runs in an earlier phase whose answers
  every worker of the join then reads.
* Shards are contiguous runs of documents balanced by tokens (an optimal linear partition: the
  largest shard as small as it can be). A document that borrows most of itself from a lender (a
  cumulative trace's step) stays in the lender's shard; a short common header (a templated preamble)
  does not glue the table together — each shard computes it once. The same alias gets the same
  shards, on the same workers, in every phase.
* A LIMIT on the result asks for more, smaller shards, so the coordinator can stop once the shards
  in document order already hold enough rows.
* What cannot be split soundly (a LIMIT below model work, a backend's own node) runs unsplit on one
  worker, and the partition says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from quail.data.tokens import TokenColumn
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.planner.prefixes import Borrow, plan_borrows

LIMIT_SHARDS_PER_WORKER = 4
"""Shards per worker when the result ends in a LIMIT: small enough to stop early, few enough to stay cheap."""
GLUED_SHARE = 0.5
"""A borrower stays with its lender when it borrows at least this share of its own tokens."""

RowRanges = tuple[tuple[int, int], ...]
"""[start, stop) row ranges, ascending and disjoint."""


@dataclass(frozen=True)
class Shard:
    """Documents of a phase's alias that one worker answers for."""

    index: int
    worker: int
    ranges: RowRanges
    documents: int
    tokens: int
    """Prefill work: every document's tokens, less what it borrows from a lender in the same shard."""

    def rows(self) -> pa.Array:
        """The shard's row positions, ascending (int32, the Scan's row type)."""
        return pa.array([row for start, stop in self.ranges for row in range(start, stop)], pa.int32())

    def describe(self) -> str:
        spans = ", ".join(f"{start}–{stop - 1}" if stop - start > 1 else f"{start}" for start, stop in self.ranges)
        return (f"shard {self.index} → worker {self.worker}: rows {spans or 'none'}, {self.documents:,} documents, "
                f"{self.tokens:,} tokens")


@dataclass(frozen=True)
class Phase:
    """Model nodes answered together, split on one alias (None: unsplit, on one worker)."""

    index: int
    alias: str | None
    nodes: tuple[str, ...]
    shards: tuple[Shard, ...]

    def worker_tokens(self, workers: int) -> list[int]:
        totals = [0] * workers
        for shard in self.shards:
            totals[shard.worker] += shard.tokens
        return totals

    def balance(self, workers: int) -> float | None:
        """Largest worker's tokens ÷ the mean over the workers (1.0 is perfect); None without tokens."""
        totals = self.worker_tokens(workers)
        mean = sum(totals) / workers
        return max(totals) / mean if mean else None


@dataclass(frozen=True)
class Partition:
    """The phases of a query's model work and the shards of each, for `workers` workers."""

    workers: int
    phases: tuple[Phase, ...]
    unsplit: str | None = None
    """Why the plan runs whole on one worker; None when it is split."""
    limit: int | None = None
    """Rows the result keeps when the plan ends in a LIMIT (the coordinator may stop early)."""
    rounds: int = 0
    """Trailing phases that run round by round (`plan_rounds`): each round's shard of every one of them in
    turn, so a LIMIT met after a round leaves the later rounds unread."""

    def describe(self) -> list[str]:
        lines = [f"{self.workers} worker(s); {len(self.phases)} phase(s)"]
        if self.unsplit is not None:
            lines.append(f"unsplit, on one worker: {self.unsplit}")
        if self.limit is not None:
            lines.append(f"LIMIT {self.limit}: shards answer in document order; the rest are cancelled once the "
                         "finished ones hold enough rows")
        for phase in self.phases:
            balance = phase.balance(self.workers)
            split = f"split on {phase.alias}" if phase.alias is not None else "unsplit"
            shown = f"; balance {balance:.3f} (largest worker ÷ mean tokens)" if balance is not None else ""
            lines.append(f"phase {phase.index}: {', '.join(phase.nodes)} — {split}{shown}")
            lines.extend(f"  {shard.describe()}" for shard in phase.shards)
        return lines


def key_alias(node: ph.PhysicalNode) -> str | None:
    """The alias a model node's answers divide by: the document it reads, or a join's anchor."""
    if isinstance(node, ph.AiFilter | ph.AiClassify | ph.AiScore | ph.AiGenerate | ph.AiEmbed):
        return node.alias
    if isinstance(node, ph.AiJoin):
        return node.anchor.alias
    return None


def plan_partition(graph: PhysicalGraph, tokens: Mapping[str, TokenColumn], workers: int, *,
                   page_tokens: int = 16) -> Partition:
    """The phases and shards of `graph`'s model work over `workers` workers."""
    if workers < 1:
        raise ValueError(f"a partition needs at least one worker, got {workers}")
    model = [node for node in graph.topological_order() if node.is_model_node]
    limit = _result_limit(graph)
    if not model:
        return Partition(workers, (), limit=limit)
    reason = unsplittable(graph, tokens)
    if reason is not None:
        return _unsplit(workers, model, tokens, reason)
    per_worker = LIMIT_SHARDS_PER_WORKER if limit is not None else 1
    shards: dict[str, tuple[Shard, ...]] = {}
    phases = []
    for index, (alias, nodes) in enumerate(_phase_groups(graph, model)):
        if alias not in shards:
            together = _sharing_groups(graph, alias, tokens[alias], page_tokens)
            shards[alias] = split_documents(tokens[alias], workers, per_worker, together)
        phases.append(Phase(index, alias, nodes, shards[alias]))
    return Partition(workers, tuple(phases), limit=limit)


ROUND_GROWTH = 2
"""Each round of a LIMIT's documents is this many times the one before."""
ROUND_MARGIN = 1.5
"""The first round reads this many times the documents the estimated selectivity says the LIMIT needs."""
FIRST_ROUND_MINIMUM = 8
"""Documents the first round reads at least: fewer make a round's fixed costs dominate."""


def plan_rounds(graph: PhysicalGraph, tokens: Mapping[str, TokenColumn]) -> Partition | None:
    """The model work of a plan that ends in a LIMIT, in rounds of documents on one worker, or None.

    The rounds cut the documents of one alias in document order — among the aliases the last phase's model
    nodes read, the one with the most documents (a join's partner when its anchor side is small): the
    first round sized from the estimated rows reaching the LIMIT (`ROUND_MARGIN` times what the estimate says
    is enough), each next one `ROUND_GROWTH` times larger, so the model reads about as many documents as the
    LIMIT needs and at most twice that much. The trailing phases whose nodes read that alias run round by
    round (`Partition.rounds`); the phases before them run whole, and every round reads their answers.
    None when there is no LIMIT to stop at, or the work cannot be divided by documents.
    """
    limit = _result_limit(graph)
    model = [node for node in graph.topological_order() if node.is_model_node]
    if limit is None or not model or unsplittable(graph, tokens) is not None:
        return None
    groups = _phase_groups(graph, model)
    split = max((a for n in groups[-1][1] for a in graph.node(n).document_aliases if a in tokens),
                key=lambda a: len(tokens[a]), default=None)
    if split is None:
        return None
    in_rounds = 0
    while in_rounds < len(groups) and all(split in graph.node(n).document_aliases for n in groups[-1 - in_rounds][1]):
        in_rounds += 1
    documents = len(tokens[split])
    rounds = round_shards(tokens[split].lengths().to_pylist(),
                          first_round(limit, _estimated_share(graph, documents), documents))
    phases = []
    for index, (alias, nodes) in enumerate(groups):
        if index >= len(groups) - in_rounds:
            phases.append(Phase(index, split, nodes, rounds))
            continue
        everything = ((0, len(tokens[alias])),) if len(tokens[alias]) else ()
        phases.append(Phase(index, alias, nodes, (Shard(0, 0, everything, len(tokens[alias]),
                                                          tokens[alias].summary().total),)))
    return Partition(1, tuple(phases), limit=limit, rounds=in_rounds)


def first_round(limit: int, share: float, documents: int) -> int:
    """Documents the first round reads: enough for `limit` rows at the estimated `share` of documents giving a
    row, with a margin; never fewer than `FIRST_ROUND_MINIMUM`, never more than there are."""
    wanted = math.ceil(ROUND_MARGIN * max(limit, 1) / max(share, 1e-3))
    return max(1, min(documents, max(wanted, FIRST_ROUND_MINIMUM)))


def round_shards(lengths: Sequence[int], first: int) -> tuple[Shard, ...]:
    """Contiguous rounds of documents in order, `first` documents then `ROUND_GROWTH` times more each time."""
    shards: list[Shard] = []
    start, size = 0, max(1, first)
    while start < len(lengths):
        stop = min(len(lengths), start + size)
        shards.append(Shard(len(shards), 0, ((start, stop),), stop - start, sum(lengths[start:stop])))
        start, size = stop, size * ROUND_GROWTH
    return tuple(shards) or (Shard(0, 0, (), 0, 0),)


def _estimated_share(graph: PhysicalGraph, documents: int) -> float:
    """Rows the planner expects to reach the LIMIT per document of the split alias, walking up from it: a join's
    estimated tuples, or the product of the filter stages' selectivities down to the scan (1.0 without any)."""
    share = 1.0
    node: ph.PhysicalNode = next(node for node in graph.nodes if isinstance(node, ph.Limit))
    while inputs := graph.inputs_of(node.id):
        node = graph.node((inputs.get("answers") or inputs.get("rows") or next(iter(inputs.values()))).source)
        if isinstance(node, ph.AiFilter):
            share *= math.prod(stage.selectivity for stage in node.stages)
        elif isinstance(node, ph.Scan):
            break
        elif node.estimate.rows is not None and documents:
            return min(1.0, share * node.estimate.rows / documents)
    return min(1.0, share)


def unsplittable(graph: PhysicalGraph, tokens: Mapping[str, TokenColumn]) -> str | None:
    """Why the plan's model work cannot be divided by documents, or None when it can."""
    for node in graph.nodes:
        if node.is_model_node and key_alias(node) is None:
            return f"{node.kind} {node.id!r} is a backend's own model node: how its answers divide is unknown"
        if node.is_model_node and key_alias(node) not in tokens:
            return f"{node.kind} {node.id!r} reads alias {key_alias(node)!r}, whose tokens were not given"
    for node in graph.nodes:
        before_model = any(graph.node(d).is_model_node for d in _descendants(graph, node.id))
        if before_model and isinstance(node, ph.Limit):
            return f"Limit {node.id!r} comes before model work: which rows reach it depends on every document"
        if before_model and not isinstance(node, ph.CORE_NODE_TYPES):
            return f"{node.kind} {node.id!r} is a backend's own node before model work"
    return None


def _unsplit(workers: int, model: Sequence[ph.PhysicalNode], tokens: Mapping[str, TokenColumn],
             reason: str) -> Partition:
    aliases = {a for a in (key_alias(n) for n in model) if a is not None and a in tokens}
    documents = sum(len(tokens[a]) for a in aliases)
    total = sum(tokens[a].summary().total for a in aliases)
    shard = Shard(0, 0, (), documents, total)
    return Partition(workers, (Phase(0, None, tuple(n.id for n in model), (shard,)),), unsplit=reason)


def _result_limit(graph: PhysicalGraph) -> int | None:
    """The count of a LIMIT the coordinator may meet early: one whose input the core runtime orders by its
    row columns (every node before it is a core node), so the first documents give the first rows."""
    limits = [node for node in graph.nodes if isinstance(node, ph.Limit)]
    if len(limits) != 1:
        return None
    before = _ancestors(graph, limits[0].id)
    if not all(isinstance(graph.node(n), ph.CORE_NODE_TYPES) for n in before):
        return None
    return limits[0].count


def _ancestors(graph: PhysicalGraph, node_id: str) -> set[str]:
    found: set[str] = set()
    pending = [e.source for e in graph.inputs_of(node_id).values()]
    while pending:
        current = pending.pop()
        if current not in found:
            found.add(current)
            pending.extend(e.source for e in graph.inputs_of(current).values())
    return found


def _descendants(graph: PhysicalGraph, node_id: str) -> set[str]:
    found: set[str] = set()
    pending = [e.target for e in graph.consumers_of(node_id)]
    while pending:
        current = pending.pop()
        if current not in found:
            found.add(current)
            pending.extend(e.target for e in graph.consumers_of(current))
    return found


def _next_model_nodes(graph: PhysicalGraph, node_id: str) -> set[str]:
    """Model nodes reachable from `node_id` through generic nodes only."""
    found: set[str] = set()
    pending = [e.target for e in graph.consumers_of(node_id)]
    seen: set[str] = set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if graph.node(current).is_model_node:
            found.add(current)
        else:
            pending.extend(e.target for e in graph.consumers_of(current))
    return found


def _phase_groups(graph: PhysicalGraph, model: Sequence[ph.PhysicalNode]) -> list[tuple[str, tuple[str, ...]]]:
    """(alias, node ids) per phase, in running order: levels as late as possible, one phase per (level, key).

    A node's level is its next model nodes' level if it shares their key, one less if it does not;
    the last model nodes sit at level 0.
    """
    level: dict[str, int] = {}
    for node in reversed(model):
        key = key_alias(node)
        later = [(level[d], key_alias(graph.node(d))) for d in _next_model_nodes(graph, node.id)]
        level[node.id] = min((lv if k == key else lv - 1 for lv, k in later), default=0)
    groups: dict[tuple[int, str], list[str]] = {}
    for node in model:  # topological order inside a group, groups by level then first appearance
        alias = key_alias(node)
        assert alias is not None
        groups.setdefault((level[node.id], alias), []).append(node.id)
    ordered = sorted(groups.items(), key=lambda item: item[0][0])
    return [(alias, tuple(ids)) for (_, alias), ids in ordered]


def _sharing_groups(graph: PhysicalGraph, alias: str, column: TokenColumn, page_tokens: int) -> list[Borrow]:
    """The borrows that keep a document in its lender's shard, when a filter on `alias` shares prefixes."""
    if not any(isinstance(n, ph.AiFilter) and n.alias == alias and n.share_prefixes for n in graph.nodes):
        return []
    documents = dict(enumerate(column.tokens.to_pylist()))
    _, borrows = plan_borrows(documents, page_tokens)
    return [b for b in borrows.values() if b.tokens >= GLUED_SHARE * len(documents[b.row])]


def split_documents(column: TokenColumn, workers: int, per_worker: int = 1,
                    together: Sequence[Borrow] = ()) -> tuple[Shard, ...]:
    """Contiguous shards of the column's documents, balanced by prefill tokens; a borrower in `together`
    stays with its lender (and computes only its tail). Shard i goes to worker i mod `workers`; at
    least one shard, even for no documents."""
    lengths = column.lengths().to_pylist()
    for borrow in together:
        lengths[borrow.row] -= borrow.tokens
    units = _units(len(lengths), [(b.row, b.lender) for b in together])
    weights = [sum(max(n, 1) for n in lengths[start:stop]) for start, stop in units]
    parts = _linear_partition(weights, workers * per_worker)
    shards = []
    for index, (first, last) in enumerate(parts):
        start, stop = (units[first][0], units[last - 1][1]) if last > first else (0, 0)
        ranges = ((start, stop),) if stop > start else ()
        shards.append(Shard(index, index % workers, ranges, stop - start, sum(lengths[start:stop])))
    return tuple(shards) or (Shard(0, 0, (), 0, 0),)


def _units(count: int, together: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Row ranges never cut: between two rows that must stay together, every row stays with them."""
    covered = [0] * (count + 1)
    for a, b in together:
        low, high = min(a, b), max(a, b)
        covered[low + 1] += 1
        covered[high + 1] -= 1
    units, start, open_spans = [], 0, 0
    for row in range(1, count + 1):  # a cut before `row` is allowed when no pair spans it
        open_spans += covered[row]
        if open_spans == 0 or row == count:
            units.append((start, row))
            start = row
    return units


def _linear_partition(weights: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """[first, last) unit indices per part: contiguous, as many parts as units allow, the heaviest as light
    as possible (binary search on the capacity, then a greedy fill that leaves one unit per part to come)."""
    if not weights:
        return []
    parts = min(parts, len(weights))
    low, high = max(weights), sum(weights)
    while low < high:
        middle = (low + high) // 2
        if _parts_needed(weights, middle) <= parts:
            high = middle
        else:
            low = middle + 1
    result, first, load = [], 0, 0
    for index, weight in enumerate(weights):
        units_left, parts_left = len(weights) - index, parts - len(result)
        if index > first and (load + weight > low or units_left < parts_left):
            result.append((first, index))
            first, load = index, 0
        load += weight
    result.append((first, len(weights)))
    return result


def _parts_needed(weights: Sequence[int], capacity: int) -> int:
    count, load = 1, 0
    for weight in weights:
        if load + weight > capacity:
            count, load = count + 1, 0
        load += weight
    return count
