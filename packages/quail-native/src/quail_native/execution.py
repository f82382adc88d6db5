"""NativeExecution: the ModelExecution of the native backend — model nodes in, answer tables out."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import pyarrow as pa

from quail import Refusal, RefusalError
from quail.extend import (
    AiClassify,
    AiFilter,
    AiGenerate,
    AiJoin,
    AiScore,
    NodeInputs,
    NodeMetrics,
    NodeOutput,
    PhysicalNode,
    candidate_tuples,
    choose_label,
    filter_answers,
    generation_answers,
    join_answers,
    label_answers,
    predicate_holds,
    score_answers,
)
from quail_native.executor.arena import KVArena
from quail_native.executor.calibration import Calibration
from quail_native.executor.filters import FilterLayout, run_filter
from quail_native.executor.generation import GenerationLayout, run_generation
from quail_native.executor.grammar import Grammars
from quail_native.executor.joins import Anchor, JoinLayout, run_join
from quail_native.executor.labels import LabelLayout, run_labels
from quail_native.executor.memory import Memory, RecomputeCost
from quail_native.executor.packing import ItemResult, Packer
from quail_native.executor.readout import AnswerColumns, greedy_tokens, log_probabilities, margins
from quail_native.executor.state import Budget, SharedState
from quail_native.models.loading import LoadedModel


class NativeExecution:
    def __init__(self, loaded: LoadedModel, answers: AnswerColumns, arena: KVArena, budget: Budget,
                 notes: tuple[str, ...] = ()) -> None:
        self.loaded = loaded
        self.answers = answers
        self.notes = notes
        memory = Memory(arena, RecomputeCost.of(loaded.arch))
        self.state = SharedState(Packer(loaded.model, arena, loaded.device), memory, budget)
        self.grammars = Grammars(loaded.path / "tokenizer.json", loaded.arch.vocab)

    def set_progress(self, callback: Callable[[int, int], None] | None) -> None:
        self.state.progress = callback

    def forget_kv(self) -> None:
        self.state.forget()

    def close(self) -> None:
        self.state.forget()

    def margin(self, result: ItemResult) -> float:
        return margins(self.loaded.model, result.hidden, self.answers)[0]

    def execute(self, node: PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        started = time.perf_counter()
        before = self.state.packer.counters.snapshot()
        kv_before = self.state.counters.snapshot()
        calibrated = isinstance(node, AiFilter | AiJoin)
        calibration = Calibration(node.calibration_prompts() if calibrated else {}, self.margin)
        if isinstance(node, AiFilter):
            table = self.filter(node, inputs, calibration)
        elif isinstance(node, AiJoin):
            table = self.join(node, inputs, calibration)
        elif isinstance(node, AiClassify):
            table = self.classify(node, inputs)
        elif isinstance(node, AiScore):
            table = self.score(node, inputs)
        elif isinstance(node, AiGenerate):
            table = self.generate(node, inputs)
        else:
            raise RefusalError(Refusal(f"the native backend has no runtime for {node.kind}"))
        passes, fresh, cached, flops = (a - b for a, b in zip(self.state.packer.counters.snapshot(), before,
                                                                strict=True))
        rows_in = inputs.rows_in
        hits, misses, evictions, recomputed = (a - b for a, b in zip(self.state.counters.snapshot(), kv_before,
                                                                   strict=True))
        metrics = NodeMetrics(time.perf_counter() - started, rows_in=rows_in, rows_out=table.num_rows,
                              fresh_tokens=int(fresh), cached_tokens=int(cached), chunks=int(passes),
                              model_flops=flops, kv_hits=hits,
                              kv_misses=misses, kv_evictions=evictions, recomputed_tokens=recomputed,
                              calibration_offsets=calibration.reported())
        return NodeOutput({"answers": table}, metrics)

    # -- filters ------------------------------------------------------------------------------

    def filter(self, node: AiFilter, inputs: NodeInputs, calibration: Calibration) -> pa.Table:
        rows = inputs.rows(node.alias)
        stages = node.stages
        layout = FilterLayout(node.preamble, node.frame, tuple(s.question for s in stages))

        def holds(stage: int, margin: float) -> bool:
            predicate = stages[stage].predicate
            return predicate_holds(predicate, margin, calibration.offset(predicate.position))

        found = run_filter(self.state, node.alias, rows, inputs.tokens(node.alias), layout, holds, self.margin,
                           node.retain_kv, share=node.share_prefixes, lead=calibration.lead(self.state, node.preamble),
                           retain_all=node.retain_kv and node.retain_all)
        return filter_answers(node.alias, [f.row for f in found],
                                     [stages[f.stage].predicate.position for f in found],
                                     [f.answer for f in found], [f.margin for f in found])

    # -- joins --------------------------------------------------------------------------------

    def join(self, node: AiJoin, inputs: NodeInputs, calibration: Calibration) -> pa.Table:
        aliases = [c.alias for c in node.predicate.prompt.columns]
        texts = {alias: inputs.tokens(alias) for alias in aliases}
        anchor_alias = node.anchor.alias
        partner_aliases = [p.alias for p in node.partners]
        anchors: dict[int, Anchor] = {}
        for item in candidate_tuples(inputs.ports, aliases):
            row = item[aliases.index(anchor_alias)]
            suffix = node.suffix([texts[partner][item[aliases.index(partner)]] for partner in partner_aliases])
            anchor = anchors.setdefault(row, Anchor(anchor_alias, row, texts[anchor_alias][row], deque()))
            anchor.pending.append((item, suffix))
        offset = calibration.offset
        found = run_join(self.state, [anchors[r] for r in sorted(anchors)],
                         JoinLayout(node.preamble, node.frame, node.semantics), self.margin,
                         lambda m: predicate_holds(node.predicate, m, offset(node.predicate.position)),
                         retain=node.retain_anchor_kv, share=node.share_prefixes,
                         lead=calibration.lead(self.state, node.preamble))
        columns = {alias: [f.rows[i] for f in found] for i, alias in enumerate(aliases)}
        return join_answers(columns, [f.answer for f in found], [f.margin for f in found], anchor=anchor_alias,
                                   partners=partner_aliases, semantics=node.semantics,
                                   position=node.predicate.position)

    # -- classify and score -------------------------------------------------------------------

    def classify(self, node: AiClassify, inputs: NodeInputs) -> pa.Table:
        rows = inputs.rows(node.alias)
        model = self.loaded.model
        layout = LabelLayout(node.preamble, node.tail, tuple(node.label_tokens), node.retain_kv)
        scores = run_labels(self.state, node.alias, rows, inputs.tokens(node.alias), layout,
                            lambda hidden, targets: log_probabilities(model, hidden, targets))
        names = [label.name for label in node.labels]
        chosen = [names[choose_label(scores[r])] for r in rows]
        return label_answers(node.alias, node.output, rows, chosen, [scores[r] for r in rows])

    def score(self, node: AiScore, inputs: NodeInputs) -> pa.Table:
        rows = inputs.rows(node.alias)
        texts = inputs.tokens(node.alias)
        found = run_filter(self.state, node.alias, rows, texts, FilterLayout(node.preamble, (), (node.question,)),
                           lambda _k, _m: True, self.margin, retain=node.retain_kv, retain_all=node.retain_kv)
        return score_answers(node.alias, node.output, [f.row for f in found], [f.margin for f in found])

    # -- generation ---------------------------------------------------------------------------

    def generate(self, node: AiGenerate, inputs: NodeInputs) -> pa.Table:
        model = self.loaded.model
        layout = GenerationLayout(node.preamble, node.tail, node.max_tokens, frozenset(node.stop), node.retain_kv)
        grammar = node.grammar
        constrain = None if grammar is None else lambda: self.grammars.matcher(grammar, node.stop)
        generated = run_generation(self.state, node.alias, inputs.rows(node.alias), inputs.tokens(node.alias), layout,
                                   lambda hidden, allowed: greedy_tokens(model, hidden, allowed), constrain)
        found = {g.row: g for g in generated}
        rows = sorted(found)
        return generation_answers(node.alias, rows, [found[r].tokens for r in rows],
                                  [found[r].finish for r in rows])
