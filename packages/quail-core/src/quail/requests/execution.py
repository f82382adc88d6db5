"""Running a RequestExecution node on a RequestEngine: its steps in order, answers in the standard shapes.

The Recombine and HashJoin steps between model steps run here with the same Arrow operators the
generic runner uses; a HashJoin step intersects the cross product of its inputs with the equality
pairs the outer runtime computed, so no table column is needed in the engine's process.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from quail.backends import shapes
from quail.backends.base import NodeMetrics, NodeOutput
from quail.errors import Refusal, RefusalError
from quail.frontend.prompts import AnswerTokens
from quail.logical.expressions import AiPredicate, Equality
from quail.physical import nodes as ph
from quail.requests.engine import EngineRequest, RequestEngine, TokenIds
from quail.requests.node import RequestExecution, RequestStrategy
from quail.requests.strategies import AnchorWork, FilterWork, JoinWork, Tally, run_filter, run_join
from quail.runtime import relational

Documents = dict[int, TokenIds]


def documents(inputs: Mapping[str, pa.Table], alias: str) -> Documents:
    """row → token ids of the `documents:<alias>` table the runner attaches (a NULL text has none)."""
    table = inputs[f"documents:{alias}"]
    rows = table.column(alias).to_pylist()
    return {r: tuple(t) for r, t in zip(rows, table.column("tokens").to_pylist(), strict=True) if t is not None}


def execute_requests(engine: RequestEngine, node: RequestExecution, inputs: Mapping[str, pa.Table]) -> NodeOutput:
    """Every step of `node` in order; the answer tables by step id, the rows left as `rows`."""
    started = time.perf_counter()
    run = _Run(engine, node.strategy, {a: documents(inputs, a) for a in node.document_aliases},
               {p.equality: p.port for p in node.pairs}, node.labels)
    for port in node.INPUTS:
        run.values[port] = inputs[port]
    for step in node.steps:
        wired = {port: run.values[edge.source] for port, edge in node.inputs_of(step.id).items()}
        run.values[step.id] = run.step(step, wired)
    tables = {"rows": run.values[node.result], **{s.id: run.values[s.id] for s in node.model_steps}}
    rows_in = sum(inputs[port].num_rows for port in node.INPUTS)
    metrics = NodeMetrics(time.perf_counter() - started, rows_in=rows_in, rows_out=tables["rows"].num_rows,
                          fresh_tokens=run.tally.fresh_tokens, cached_tokens=run.tally.cached_tokens,
                          calibration_offsets=tuple(run.offsets.items()) or None)
    return NodeOutput(tables, metrics)


@dataclass
class _Run:
    engine: RequestEngine
    strategy: RequestStrategy
    texts: dict[str, Documents]
    pairs: dict[Equality, str]
    labels: AnswerTokens
    values: dict[str, pa.Table] = field(default_factory=dict)
    tally: Tally = field(default_factory=Tally)
    offsets: dict[int, float] = field(default_factory=dict)

    def calibrate(self, prompts: Mapping[int, list[TokenIds]]) -> None:
        """Mean margin per predicate position over its content-free prompts (one batch of requests)."""
        keyed = [(position, prompt) for position, group in prompts.items() for prompt in group]
        if not keyed:
            return
        answers = self.engine.generate([EngineRequest(i, p, self.labels) for i, (_, p) in enumerate(keyed)])
        margins: dict[int, list[float]] = {}
        for answer in answers:
            self.tally.add(answer)
            margins.setdefault(keyed[answer.key][0], []).append(answer.margin)
        self.offsets.update({position: sum(m) / len(m) for position, m in margins.items()})

    def holds(self, predicate: AiPredicate, margin: float) -> bool:
        return shapes.predicate_holds(predicate, margin, self.offsets.get(predicate.position, 0.0))

    def step(self, step: ph.PhysicalNode, inputs: dict[str, pa.Table]) -> pa.Table:
        if isinstance(step, ph.AiFilter):
            return self.filter(step, inputs["rows"])
        if isinstance(step, ph.AiScore):
            return self.score(step, inputs["rows"])
        if isinstance(step, ph.AiJoin):
            return self.join(step, inputs)
        if isinstance(step, ph.HashJoin):
            return self.candidates(step, inputs["left"], inputs["right"])
        if isinstance(step, ph.RecombineFilter):
            return relational.survivors(inputs["rows"], inputs["answers"], step.alias)
        if isinstance(step, ph.RecombineJoin):
            return relational.recombine_join(inputs["left"], inputs["right"], inputs["answers"], step.semantics)
        if isinstance(step, ph.RecombineScores):
            return relational.add_scores(inputs["rows"], inputs["answers"], step.alias, step.output)
        if isinstance(step, ph.RecombineVerdicts):
            return relational.add_verdicts(inputs["rows"], inputs["answers"], step.alias, step.output)
        if isinstance(step, ph.DropNullDocuments):
            present = {a: pa.array(sorted(self.texts[a]), pa.int32()) for a in step.aliases}
            return relational.present_documents(inputs["rows"], present, step.distinct)
        raise RefusalError(Refusal(f"a RequestExecution cannot run {step.kind} {step.id!r}"))

    def filter(self, step: ph.AiFilter, rows: pa.Table) -> pa.Table:
        texts, stages = self.texts[step.alias], step.stages
        self.calibrate({s.predicate.position: [step.preamble + d + step.frame + s.question for d in step.calibration]
                        for s in stages})
        prefix = {r: step.preamble + texts[r] + step.frame for r in texts}
        work = FilterWork(sorted(set(rows.column(step.alias).to_pylist())), len(stages),
                          lambda row, k: prefix[row] + stages[k].question,
                          lambda k, margin: self.holds(stages[k].predicate, margin), self.labels)
        found = run_filter(self.engine, self.strategy.filters, work, self.tally)
        return shapes.filter_answers(step.alias, [v.rows[0] for v in found],
                                     [stages[v.stage].predicate.position for v in found],
                                     [v.answer for v in found], [v.margin for v in found])

    def score(self, step: ph.AiScore, rows: pa.Table) -> pa.Table:
        texts = self.texts[step.alias]
        work = FilterWork(sorted(set(rows.column(step.alias).to_pylist())), 1,
                          lambda row, _k: step.preamble + texts[row] + step.question, lambda _k, _m: True,
                          self.labels)
        found = run_filter(self.engine, "operator", work, self.tally)
        return shapes.score_answers(step.alias, step.output, [v.rows[0] for v in found], [v.margin for v in found])

    def join(self, step: ph.AiJoin, inputs: dict[str, pa.Table]) -> pa.Table:
        aliases = [c.alias for c in step.predicate.prompt.columns]
        anchor_alias, partners = step.anchor.alias, [p.alias for p in step.partners]
        at = {alias: aliases.index(alias) for alias in aliases}
        grouped: dict[int, list[tuple[tuple[int, ...], TokenIds]]] = {}
        for item in _tuples(inputs, aliases):
            suffix: TokenIds = ()
            for label, partner in zip(step.labels, partners, strict=True):
                suffix += label + self.texts[partner][item[at[partner]]]
            grouped.setdefault(item[at[anchor_alias]], []).append((item, suffix + step.cue))
        anchors = [AnchorWork(row, step.preamble + self.texts[anchor_alias][row] + step.frame, tuple(grouped[row]))
                   for row in sorted(grouped)]
        self.calibrate({step.predicate.position: [
            step.preamble + d + step.frame + sum((label + d for label in step.labels), ()) + step.cue
            for d in step.calibration]})
        work = JoinWork(anchors, step.semantics != "full", lambda m: self.holds(step.predicate, m), self.labels)
        found = run_join(self.engine, self.strategy.joins, work, self.tally)
        columns = {alias: [v.rows[i] for v in found] for i, alias in enumerate(aliases)}
        return shapes.join_answers(columns, [v.answer for v in found], [v.margin for v in found],
                                   anchor=anchor_alias, partners=partners, semantics=step.semantics,
                                   position=step.predicate.position)

    def candidates(self, step: ph.HashJoin, left: pa.Table, right: pa.Table) -> pa.Table:
        """left × right, kept where every equality's outer pairs table has the pair."""
        pairs = relational.equality_pairs(left, right, (), {})
        for equality in step.equalities:
            keys = list(equality.aliases)
            allowed = self.values[self.pairs[equality]].select(keys).group_by(keys).aggregate([])
            pairs = pairs.join(allowed, keys, join_type="left semi")
        order = pairs.column_names
        return pairs.sort_by([(k, "ascending") for k in order]) if pairs.num_rows else pairs



def _tuples(inputs: Mapping[str, pa.Table], aliases: list[str]) -> list[tuple[int, ...]]:
    """The candidate tuples of a join: its `candidates` input, else every left × right pair."""
    table = inputs.get("candidates")
    if table is None:
        left = inputs["left"].select([a for a in aliases if a in inputs["left"].column_names])
        right = inputs["right"].select([a for a in aliases if a in inputs["right"].column_names])
        table = relational.equality_pairs(_distinct(left), _distinct(right), (), {})
    return sorted({tuple(r[a] for a in aliases) for r in table.select(aliases).to_pylist()})


def _distinct(table: pa.Table) -> pa.Table:
    return table.group_by(table.column_names).aggregate([]) if table.num_columns else table


class RequestModelExecution:
    """The ModelExecution of a request backend: one booted engine, RequestExecution nodes in, answers out."""

    def __init__(self, engine: RequestEngine) -> None:
        self.engine = engine

    def execute(self, node: ph.PhysicalNode, inputs: Mapping[str, pa.Table]) -> NodeOutput:
        if not isinstance(node, RequestExecution):
            raise RefusalError(Refusal(f"a request backend runs RequestExecution nodes, not {node.kind} {node.id!r}",
                                       hints=("plan the query on this backend instead of editing model nodes in",)))
        return execute_requests(self.engine, node, inputs)

    def close(self) -> None:
        self.engine.close()
