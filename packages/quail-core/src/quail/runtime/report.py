"""The execution report: what ran, what it cost, and how it compares with the estimates.

Every key is present for every backend; an unknown value is None, never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc

from quail.compute.request import NodeMetrics, ShardMetrics, sum_known
from quail.data.tokens import TokenColumn
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.planner.prefixes import common_prefix
from quail.schemas import STATUS, parse_answer

ReportValue = None | bool | int | float | str | list["ReportValue"] | dict[str, "ReportValue"]


@dataclass(frozen=True)
class StageReport:
    """One AI predicate: its selectivity as given and as observed, and how much it evaluated."""

    position: int
    node: str
    aliases: tuple[str, ...]
    provided_selectivity: float | None
    assumed_selectivity: bool
    observed_selectivity: float | None
    evaluated: int


def stages(graph: PhysicalGraph, answers: Mapping[str, pa.Table]) -> list[StageReport]:
    reports = []
    for node in graph.nodes:
        table = answers.get(node.id)
        if isinstance(node, ph.AiFilter) and table is not None:
            for stage in node.stages:
                mine = table.filter(pc.equal(table.column("predicate"), stage.predicate.position))
                reports.append(_stage(stage.predicate.position, node.id, (node.alias,), stage.selectivity,
                                      stage.assumed_selectivity, mine))
        elif isinstance(node, ph.AiJoin) and table is not None:
            aliases = (node.anchor.alias, *(p.alias for p in node.partners))
            reports.append(_stage(node.predicate.position, node.id, aliases, node.selectivity,
                                  node.assumed_selectivity, table))
    return sorted(reports, key=lambda s: s.position)


def _stage(position: int, node: str, aliases: tuple[str, ...], selectivity: float, assumed: bool,
           table: pa.Table) -> StageReport:
    evaluated = table.num_rows
    true = pc.sum(table.column("answer").cast(pa.int64())).as_py() or 0
    observed = true / evaluated if evaluated else None
    return StageReport(position, node, aliases, None if assumed else selectivity, assumed, observed, evaluated)


class _PrefixCounter:
    """Counts the tokens of every distinct prompt prefix once (a trie's size, by layout): each preamble once, and
    the documents after each preamble once (a document after two different preambles — few-shot examples first in
    one node — is two prefixes)."""

    def __init__(self, tokens: Mapping[str, TokenColumn]) -> None:
        self.tokens = tokens
        self.preambles: set[tuple[int, ...]] = set()
        self.documents: dict[tuple[tuple[int, ...], str], set[int]] = {}
        self.total = 0

    def document_prefixes(self, preamble: tuple[int, ...], alias: str, rows: pa.Array) -> None:
        if preamble not in self.preambles:
            self.preambles.add(preamble)
            self.total += len(preamble)
        seen = self.documents.setdefault((preamble, alias), set())
        seen.update(rows.to_pylist())

    def finish(self) -> int:
        """Documents of an alias after one preamble share their common token prefixes: Σ len − LCP(previous)
        sorted."""
        total = self.total
        for (_, alias), rows in self.documents.items():
            column = self.tokens[alias]
            ordered = sorted(column.row(r) for r in rows)
            previous: tuple[int, ...] = ()
            for tokens in ordered:
                total += len(tokens) - common_prefix(previous, tokens)
                previous = tokens
        return total


def minimum_tokens(graph: PhysicalGraph, answers: Mapping[str, pa.Table], tokens: Mapping[str, TokenColumn]) -> int:
    """Fresh tokens a perfect executor needs for what this run evaluated: each distinct prefix once."""
    counter = _PrefixCounter(tokens)
    for node in graph.nodes:
        table = answers.get(node.id)
        if table is None or table.num_rows == 0:
            continue
        # the tails are counted before they are added: counting them records the preamble in counter.total,
        # which `counter.total += …` would read before and overwrite after
        if isinstance(node, ph.AiFilter):
            tails = _filter_tails(node, table, counter) + _filter_calibration(node)
            counter.total += tails
        elif isinstance(node, ph.AiJoin):
            tails = _join_tails(node, table, counter, tokens) + _join_calibration(node)
            counter.total += tails
        elif isinstance(node, ph.AiClassify | ph.AiScore):
            rows = pc.unique(table.column(node.alias).combine_chunks())
            counter.document_prefixes(node.preamble, node.alias, rows)
            per_row = (len(node.tail) + sum(max(len(t) - 1, 0) for t in node.label_tokens)
                       if isinstance(node, ph.AiClassify) else len(node.question))
            counter.total += per_row * len(rows)
        elif isinstance(node, ph.AiGenerate):
            rows = pc.unique(table.column(node.alias).combine_chunks())
            counter.document_prefixes(node.preamble, node.alias, rows)
            counter.total += len(node.tail) * len(rows) + _fed_back(node, table)
        elif isinstance(node, ph.AiEmbed):  # bidirectional attention: no prefix is shared, each document whole
            rows = pc.unique(table.column(node.alias).combine_chunks()).to_pylist()
            counter.total += sum(node.positions(tokens[node.alias].row(r)) for r in rows)
    return counter.finish()


def _fed_back(node: ph.AiGenerate, table: pa.Table) -> int:
    """Generated tokens a decoder must compute to write the next one: every token of a generation the model ended
    (its stop token is never fed back), all but the last of one the bound ended. Each distinct document once."""
    seen: dict[int, int] = {}
    for row, tokens, finish in zip(table.column(node.alias).to_pylist(), table.column("tokens").to_pylist(),
                                   table.column("finish").to_pylist(), strict=True):
        seen[row] = len(tokens) - (1 if finish == "length" and tokens else 0)
    return sum(seen.values())


def _filter_tails(node: ph.AiFilter, table: pa.Table, counter: _PrefixCounter) -> int:
    rows = pc.unique(table.column(node.alias).combine_chunks())
    counter.document_prefixes(node.preamble, node.alias, rows)
    lengths = {s.predicate.position: len(s.question) for s in node.stages}
    per_stage = table.group_by("predicate").aggregate([("predicate", "count")])
    asked = sum(lengths[p] * c for p, c in zip(per_stage.column("predicate").to_pylist(),
                                               per_stage.column("predicate_count").to_pylist(), strict=True))
    return len(node.frame) * len(rows) + asked


def _filter_calibration(node: ph.AiFilter) -> int:
    """Each content-free document and the frame once, then every stage's question."""
    questions = sum(len(s.question) for s in node.stages)
    return sum(len(d) + len(node.frame) + questions for d in node.calibration)


def _join_calibration(node: ph.AiJoin) -> int:
    """The content-free document in every slot, once per content-free document."""
    return sum(len(d) + len(node.frame) + sum(len(label) + len(d) for label in node.labels) + len(node.cue)
               for d in node.calibration)


def _join_tails(node: ph.AiJoin, table: pa.Table, counter: _PrefixCounter, tokens: Mapping[str, TokenColumn]) -> int:
    anchor = node.anchor.alias
    anchors = pc.unique(table.column(anchor).combine_chunks())
    counter.document_prefixes(node.preamble, anchor, anchors)
    total = len(node.frame) * len(anchors) + (len(node.cue) + sum(len(x) for x in node.labels)) * table.num_rows
    for partner in node.partners:
        lengths = tokens[partner.alias].lengths()
        total += pc.sum(pc.take(lengths, table.column(partner.alias)).cast(pa.int64())).as_py() or 0
    return total


@dataclass(frozen=True)
class BlockingReport:
    """A blocked AI join: pairs of distinct texts before and after blocking, and the recall estimated from the
    pairs left out that a sample of them says would have held."""

    pairs_before: int
    pairs_after: int
    sampled: int
    sampled_true: int
    inside_true: int
    estimated_recall: float | None


@dataclass(frozen=True)
class QueryReport:
    backend: str
    model: str
    device: str
    order_rule: str
    wall_s: float
    estimated_seconds: float | None
    sol_seconds: float | None
    boot_s: float | None
    boot_kind: str | None
    fresh_tokens: int | None
    cached_tokens: int | None
    minimum_tokens: int | None
    stages: tuple[StageReport, ...]
    node_metrics: Mapping[str, NodeMetrics]
    remarks: tuple[str, ...]
    engine: tuple[str, ...] = ()
    """What the engine said of itself when it booted (precision chosen, …)."""
    oversized_documents: Mapping[str, ReportValue] | None = None
    shards: tuple[ShardMetrics, ...] = ()
    """Per shard when the compute provider split the model work over workers."""
    null_inputs: Mapping[str, int] | None = None
    """Per model node: input rows skipped because their document is NULL (no model work; the answer is NULL)."""
    unparsed: Mapping[str, int] | None = None
    """Per structured generation (its output name): rows whose output did not parse as the schema (their fields are
    NULL, their status says why)."""
    blocking: BlockingReport | None = None
    """What similarity blocking of an AI join did (None without blocking)."""

    def kv(self) -> dict[str, int | None]:
        metrics = [m for m in self.node_metrics.values()]
        model = [m for m in metrics if m.fresh_tokens is not None or m.kv_hits is not None]
        return {
            "hits": sum_known([m.kv_hits for m in model]),
            "misses": sum_known([m.kv_misses for m in model]),
            "evictions": sum_known([m.kv_evictions for m in model]),
            "recomputed_tokens": sum_known([m.recomputed_tokens for m in model]),
        }

    def answers(self) -> dict[str, int | None]:
        """Model answers by origin over the model nodes: the answer store, the backend, an identical prompt."""
        model = [m for m in self.node_metrics.values() if m.computed_answers is not None]
        return {
            "stored": sum_known([m.stored_answers for m in model]),
            "computed": sum_known([m.computed_answers for m in model]),
            "duplicates": sum_known([m.duplicate_answers for m in model]),
        }

    def calibration(self) -> dict[str, float] | None:
        """Predicate position → the margin a TRUE answer had to beat; None when nothing was calibrated."""
        offsets = {str(p): o for m in self.node_metrics.values() for p, o in (m.calibration_offsets or ())}
        return offsets or None

    def as_dict(self) -> dict[str, ReportValue]:
        return {
            "backend": self.backend,
            "model": self.model,
            "device": self.device,
            "wall_s": self.wall_s,
            "estimated_seconds": self.estimated_seconds,
            "sol_seconds": self.sol_seconds,
            "boot_s": self.boot_s,
            "boot_kind": self.boot_kind,
            "fresh_tokens": self.fresh_tokens,
            "cached_tokens": self.cached_tokens,
            "minimum_tokens": self.minimum_tokens,
            "stages": [dict(asdict(s), aliases=list(s.aliases)) for s in self.stages],
            "node_metrics": {k: asdict(v) for k, v in self.node_metrics.items()},
            "kv": dict(self.kv()),
            "answers": dict(self.answers()),
            "calibration": self.calibration(),
            "remarks": list(self.remarks),
            "engine": list(self.engine),
            "oversized_documents": None if self.oversized_documents is None else dict(self.oversized_documents),
            "order_rule": self.order_rule,
            "shards": [asdict(s) for s in self.shards],
            "retries": sum(s.retries for s in self.shards),
            "null_inputs": dict(self.null_inputs or {}),
            "unparsed": dict(self.unparsed or {}),
            "blocking": None if self.blocking is None else asdict(self.blocking),
        }


def unparsed(graph: PhysicalGraph, answers: Mapping[str, pa.Table], decode: Callable[[Sequence[int]], str]
             ) -> dict[str, int]:
    """Per structured generation: how many rows' outputs did not parse as its schema (`schemas.parse_answer`; each
    distinct output read once)."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        table = answers.get(node.id)
        if not isinstance(node, ph.AiGenerate) or node.schema is None or table is None:
            continue
        read: dict[tuple[int, ...], bool] = {}
        for ids in table.column("tokens").to_pylist():
            key = tuple(ids)
            if key not in read:
                read[key] = parse_answer(decode(ids).strip(), node.schema)[STATUS] != ""
            counts[node.output] = counts.get(node.output, 0) + read[key]
    return counts


def null_inputs(graph: PhysicalGraph, metrics: Mapping[str, NodeMetrics]) -> dict[str, int]:
    """Model node id → rows whose document was NULL and that it therefore never saw."""
    skipped: dict[str, int] = {}
    for node in graph.nodes:
        measured = metrics.get(node.id)
        if not isinstance(node, ph.DropNullDocuments) or measured is None:
            continue
        dropped = (measured.rows_in or 0) - (measured.rows_out or 0)
        for edge in graph.consumers_of(node.id):
            if graph.node(edge.target).is_model_node or isinstance(graph.node(edge.target), ph.HashJoin):
                target = _model_consumer(graph, edge.target)
                skipped[target] = skipped.get(target, 0) + dropped
    return skipped


def _model_consumer(graph: PhysicalGraph, node_id: str) -> str:
    """The model node fed by `node_id` (through a candidates HashJoin), or `node_id` itself."""
    node = graph.node(node_id)
    if node.is_model_node:
        return node_id
    consumers = [e.target for e in graph.consumers_of(node_id) if graph.node(e.target).is_model_node]
    return consumers[0] if consumers else node_id
