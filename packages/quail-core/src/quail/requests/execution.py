"""RequestModelExecution: a request backend's ModelExecution — model nodes in, engine requests out.

The generic runner hands it one AiFilter, AiJoin or AiScore node at a time (with the rows and
documents the node reads); the node lays out its own prompts, the schedules of
`quail.requests.strategies` feed them to the engine, and the answers come back in the standard
shapes. Calibration asks the node's content-free prompts as one batch first. An AiClassify, AiGenerate
or AiEmbed node goes to the engine's optional role for it, and is refused when the engine lacks it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from quail.backends import shapes
from quail.backends.base import NodeInputs, NodeOutput
from quail.compute.request import NodeMetrics
from quail.data.relational import candidate_tuples
from quail.data.tokenizer import TokenIds
from quail.errors import Refusal, RefusalError
from quail.logical.expressions import AiPredicate
from quail.physical import nodes as ph
from quail.prompts import AnswerTokens
from quail.requests.engine import EmbedsText, EngineRequest, GeneratesText, ReadsContinuations, RequestEngine
from quail.requests.strategies import (
    AnchorWork,
    FilterWork,
    JoinWork,
    RequestStrategy,
    Tally,
    run_filter,
    run_join,
)

REQUEST_NODES: tuple[type[ph.PhysicalNode], ...] = (ph.AiFilter, ph.AiJoin, ph.AiScore)
"""The model nodes one TRUE/FALSE request per prompt can answer."""
LABEL_NODES = (*REQUEST_NODES, ph.AiClassify)
"""The model nodes an engine that `ReadsContinuations` answers: AI.CLASSIFY as well."""
GENERATION_NODES = (ph.AiGenerate,)
"""The model nodes an engine that `GeneratesText` answers besides."""


class RequestModelExecution:
    """One booted engine; each model node's prompts go to it as requests, answers come back as tables.
    `backend` is the name a refusal gives."""

    def __init__(self, engine: RequestEngine, strategy: RequestStrategy, backend: str = "request") -> None:
        self.engine = engine
        self.strategy = strategy
        self.backend = backend

    def execute(self, node: ph.PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        started = time.perf_counter()
        if isinstance(node, ph.AiClassify) and isinstance(self.engine, ReadsContinuations):
            return _classified(self.engine, node, inputs, started)
        if isinstance(node, ph.AiGenerate) and isinstance(self.engine, GeneratesText):
            return _generated(self.engine, node, inputs, started)
        if isinstance(node, ph.AiEmbed):
            if not isinstance(self.engine, EmbedsText):
                raise RefusalError(Refusal(
                    f"backend {self.backend!r} cannot run {node.describe()}",
                    (f"its engine ({type(self.engine).__name__}) does not embed text: it has no `embeddings` "
                     "(the EmbedsText role)",),
                    hints=("run embeddings on the native backend, or on an engine that plays EmbedsText",)))
            return _embedded(self.engine, node, inputs, started)
        if not isinstance(node, REQUEST_NODES):
            raise RefusalError(Refusal(f"a request backend cannot run {node.kind} {node.id!r}",
                                       hints=("plan the query on this backend; AI.CLASSIFY runs on native",)))
        if node.answers is None:
            raise RefusalError(Refusal(f"{node.kind} {node.id!r} names no TRUE/FALSE answer tokens",
                                       hints=("plan the query on this backend: its plan binds them",)))
        run = _NodeRun(self.engine, self.strategy, node.answers)
        if isinstance(node, ph.AiFilter):
            table = run.filter(node, inputs)
        elif isinstance(node, ph.AiJoin):
            table = run.join(node, inputs)
        else:
            table = run.score(node, inputs)
        metrics = NodeMetrics(time.perf_counter() - started, rows_in=inputs.rows_in, rows_out=table.num_rows,
                              fresh_tokens=run.tally.fresh_tokens, cached_tokens=run.tally.cached_tokens,
                              calibration_offsets=tuple(run.offsets.items()) or None)
        return NodeOutput({"answers": table}, metrics)

    def forget_kv(self) -> None:
        self.engine.forget_cached_prefixes()

    def close(self) -> None:
        self.engine.close()


def _classified(engine: ReadsContinuations, node: ph.AiClassify, inputs: NodeInputs, started: float) -> NodeOutput:
    """Each row's label scores (summed continuation log-probabilities) and the best label, ties to the earlier."""
    rows, texts = inputs.rows(node.alias), inputs.tokens(node.alias)
    scores = [engine.continuation_logprobs(node.document_prompt(texts[row]), node.label_tokens) for row in rows]
    names = [label.name for label in node.labels]
    table = shapes.label_answers(node.alias, node.output, rows, [names[shapes.choose_label(s)] for s in scores],
                                 scores)
    fresh = sum(len(node.document_prompt(texts[row])) + sum(map(len, node.label_tokens)) for row in rows)
    metrics = NodeMetrics(time.perf_counter() - started, rows_in=inputs.rows_in, rows_out=table.num_rows,
                          fresh_tokens=fresh, cached_tokens=0)
    return NodeOutput({"answers": table}, metrics)


def _generated(engine: GeneratesText, node: ph.AiGenerate, inputs: NodeInputs, started: float) -> NodeOutput:
    """Every row's greedy generation, one batch for the engine's own scheduler (its prefix cache shares the
    preamble); fresh tokens are the prompts' uncached tokens and the tokens fed back to write the next one."""
    rows, texts = inputs.rows(node.alias), inputs.tokens(node.alias)
    found = engine.greedy_generations([node.document_prompt(texts[row]) for row in rows], node.max_tokens, node.stop,
                                      node.grammar)
    if len(found) != len(rows):
        raise RuntimeError(f"the engine answered {len(rows)} generation requests with {len(found)} generations")
    table = shapes.generation_answers(node.alias, rows, [g.tokens for g in found], [g.finish for g in found])
    fed = sum(len(g.tokens) - (g.finish == "length" and bool(g.tokens)) for g in found)
    metrics = NodeMetrics(time.perf_counter() - started, rows_in=inputs.rows_in, rows_out=table.num_rows,
                          fresh_tokens=sum(g.prompt_tokens - g.cached_tokens for g in found) + fed,
                          cached_tokens=sum(g.cached_tokens for g in found))
    return NodeOutput({"answers": table}, metrics)


def _embedded(engine: EmbedsText, node: ph.AiEmbed, inputs: NodeInputs, started: float) -> NodeOutput:
    """Every row's vector, one batch for the engine; fresh tokens are the positions the encoder computes (its
    special tokens included, a long document cut to the context), none cached."""
    rows, documents = inputs.rows(node.alias), inputs.tokens(node.alias)
    vectors = engine.embeddings([documents[row] for row in rows], node.context, node.special_tokens)
    if len(vectors) != len(rows):
        raise RuntimeError(f"the engine answered {len(rows)} embedding requests with {len(vectors)} vectors")
    wrong = [len(v) for v in vectors if len(v) != node.dimensions]
    if wrong:
        raise RuntimeError(f"the engine returned vectors of {wrong[0]} numbers; {node.describe()} expects "
                           f"{node.dimensions}")
    table = shapes.embedding_answers(node.alias, rows, vectors)
    metrics = NodeMetrics(time.perf_counter() - started, rows_in=inputs.rows_in, rows_out=table.num_rows,
                          fresh_tokens=sum(node.positions(documents[row]) for row in rows), cached_tokens=0)
    return NodeOutput({"answers": table}, metrics)


@dataclass
class _NodeRun:
    engine: RequestEngine
    strategy: RequestStrategy
    labels: AnswerTokens
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

    def holds(self, predicate: AiPredicate) -> Callable[[float], bool]:
        return lambda margin: shapes.predicate_holds(predicate, margin, self.offsets.get(predicate.position, 0.0))

    def filter(self, node: ph.AiFilter, inputs: NodeInputs) -> pa.Table:
        texts, stages = inputs.tokens(node.alias), node.stages
        self.calibrate(node.calibration_prompts())
        prefix = {row: node.prefix(document) for row, document in texts.items()}
        work = FilterWork(inputs.rows(node.alias), len(stages), lambda row, k: prefix[row] + stages[k].question,
                          lambda k, margin: self.holds(stages[k].predicate)(margin), self.labels)
        found = run_filter(self.engine, self.strategy.filters, work, self.tally)
        return shapes.filter_answers(node.alias, [v.rows[0] for v in found],
                                     [stages[v.stage].predicate.position for v in found],
                                     [v.answer for v in found], [v.margin for v in found])

    def score(self, node: ph.AiScore, inputs: NodeInputs) -> pa.Table:
        texts = inputs.tokens(node.alias)
        work = FilterWork(inputs.rows(node.alias), 1, lambda row, _k: node.document_prompt(texts[row]),
                          lambda _k, _m: True, self.labels)
        found = run_filter(self.engine, "operator", work, self.tally)
        return shapes.score_answers(node.alias, node.output, [v.rows[0] for v in found], [v.margin for v in found])

    def join(self, node: ph.AiJoin, inputs: NodeInputs) -> pa.Table:
        aliases = [c.alias for c in node.predicate.prompt.columns]
        anchor, partners = node.anchor.alias, [p.alias for p in node.partners]
        texts = {alias: inputs.tokens(alias) for alias in aliases}
        at = {alias: aliases.index(alias) for alias in aliases}
        grouped: dict[int, list[tuple[tuple[int, ...], TokenIds]]] = {}
        for item in candidate_tuples(inputs.ports, aliases):
            suffix = node.suffix([texts[p][item[at[p]]] for p in partners])
            grouped.setdefault(item[at[anchor]], []).append((item, suffix))
        anchors = [AnchorWork(row, node.anchor_prefix(texts[anchor][row]), tuple(grouped[row]))
                   for row in sorted(grouped)]
        self.calibrate(node.calibration_prompts())
        work = JoinWork(anchors, node.semantics != "full", self.holds(node.predicate), self.labels)
        found = run_join(self.engine, self.strategy.joins, work, self.tally)
        columns = {alias: [v.rows[i] for v in found] for i, alias in enumerate(aliases)}
        return shapes.join_answers(columns, [v.answer for v in found], [v.margin for v in found],
                                   anchor=anchor, partners=partners, semantics=node.semantics,
                                   position=node.predicate.position)
