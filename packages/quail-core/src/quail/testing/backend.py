"""KeywordBackend: the real backend contract, answered by the keyword rule on decoded documents."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pyarrow as pa

from quail.backends import shapes
from quail.backends.base import (
    GpuContext,
    ModelExecution,
    ModelIdentity,
    NodeInputs,
    NodeOutput,
    PlanningContext,
    SupportResult,
)
from quail.backends.default import Backend
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.request import NodeMetrics
from quail.config import EngineConfig
from quail.data.relational import candidate_tuples
from quail.data.tokenizer import Tokenizer
from quail.errors import Refusal, RefusalError
from quail.physical import nodes as ph
from quail.prompts import BASE_STYLE, AnswerTokens, PromptStyle
from quail.schemas import SchemaType
from quail.testing.rules import (
    classify_margins,
    embedded_vector,
    generated_text,
    generated_value,
    predicate_margin,
)
from quail.testing.tokenizer import ByteTokenizer

RULE_VERSION = "keyword-1"
"""Changes whenever `quail.testing.rules` answers differently, so stored keyword answers are not reused."""


class KeywordBackend(Backend):
    """A CPU backend for tests: plans like every backend, answers by rule instead of a model.

    Keyword backends of one class and tokenizer are equal: sessions share the execution one boots.
    """

    name = "keyword"

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self._tokenizer = tokenizer or ByteTokenizer()
        self.started = 0

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, KeywordBackend) and \
            (other.name, other._tokenizer.identity) == (self.name, self._tokenizer.identity)

    def __hash__(self) -> int:
        return hash((type(self), self.name, self._tokenizer.identity))

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        if device.kind != "cpu":
            return SupportResult.reject("the keyword test backend runs on the CPU only")
        return SupportResult.accept()

    def tokenizer(self, model: ModelSpec) -> Tokenizer:
        """Whatever the model, the keyword rule reads the text back from this tokenizer's ids."""
        return self._tokenizer

    def model_identity(self, model: ModelSpec, device: DeviceSpec, config: EngineConfig) -> ModelIdentity:
        """The keyword rule reads decoded text: its answers depend on the rule and the tokenizer, not on a model."""
        return ModelIdentity(files=(), settings=(("rule", RULE_VERSION), ("tokenizer", self._tokenizer.identity)))

    def prompt_style(self, model: ModelSpec) -> PromptStyle:
        return BASE_STYLE

    def answer_tokens(self, tokenizer: Tokenizer) -> AnswerTokens | None:
        """The rule answers in margins directly: no answer token is read."""
        return None

    def calibrates(self, context: PlanningContext) -> bool:
        """Keyword margins carry no language-model bias, so `auto` leaves them uncalibrated."""
        return context.calibration == "on"

    def start(self, context: GpuContext) -> ModelExecution:
        self.started += 1
        return KeywordExecution(self._tokenizer)


class KeywordExecution:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.closed = False
        self.progress: Callable[[int, int], None] | None = None
        self.offsets: dict[int, float] = {}

    def set_progress(self, callback: Callable[[int, int], None] | None) -> None:
        self.progress = callback

    def close(self) -> None:
        self.closed = True

    def text(self, inputs: NodeInputs, alias: str) -> dict[int, str]:
        return {row: self.tokenizer.decode(tokens) for row, tokens in inputs.tokens(alias).items()}

    def execute(self, node: ph.PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        started = time.perf_counter()
        self.offsets = {}
        if isinstance(node, ph.AiFilter):
            table, tokens = self.filter(node, inputs)
        elif isinstance(node, ph.AiJoin):
            table, tokens = self.join(node, inputs)
        elif isinstance(node, ph.AiClassify):
            table, tokens = self.classify(node, inputs)
        elif isinstance(node, ph.AiScore):
            table, tokens = self.score(node, inputs)
        elif isinstance(node, ph.AiGenerate):
            table, tokens = self.generate(node, inputs)
        elif isinstance(node, ph.AiEmbed):
            table, tokens = self.embed(node, inputs)
        else:
            raise RefusalError(Refusal(f"the keyword backend cannot run {node.kind}"))
        if self.progress is not None:
            self.progress(table.num_rows, table.num_rows)
        metrics = NodeMetrics(time.perf_counter() - started, rows_in=inputs.rows_in, rows_out=table.num_rows,
                              fresh_tokens=tokens, cached_tokens=0,
                              calibration_offsets=tuple(self.offsets.items()) or None)
        return NodeOutput({"answers": table}, metrics)

    def filter(self, node: ph.AiFilter, inputs: NodeInputs) -> tuple[pa.Table, int]:
        documents = inputs.tokens(node.alias)
        texts = {row: self.tokenizer.decode(tokens) for row, tokens in documents.items()}
        rows, predicates, answers, margins = [], [], [], []
        tokens = 0
        offsets = {s.predicate.position: self.offset(s.predicate.prompt.template, 1, node.calibration)
                   for s in node.stages}
        if node.calibration:
            self.offsets.update(offsets)
        for row in inputs.ports["rows"].column(node.alias).to_pylist():
            for k, stage in enumerate(node.stages):
                margin = predicate_margin(stage.predicate.prompt.template, [texts[row]])
                answer = shapes.predicate_holds(stage.predicate, margin, offsets[stage.predicate.position])
                rows.append(row)
                predicates.append(stage.predicate.position)
                answers.append(answer)
                margins.append(margin)
                tokens += len(node.prompt(documents[row], k))
                if not answer:
                    break
        return shapes.filter_answers(node.alias, rows, predicates, answers, margins), tokens

    def join(self, node: ph.AiJoin, inputs: NodeInputs) -> tuple[pa.Table, int]:
        aliases = [c.alias for c in node.predicate.prompt.columns]
        documents = {alias: inputs.tokens(alias) for alias in aliases}
        texts = {alias: {row: self.tokenizer.decode(d) for row, d in documents[alias].items()} for alias in aliases}
        partners = [aliases.index(p.alias) for p in node.partners]
        tuples = candidate_tuples(inputs.ports, aliases)
        anchor_index = aliases.index(node.anchor.alias)
        answered: dict[int, bool] = {}
        columns: dict[str, list[int]] = {a: [] for a in aliases}
        answers, margins = [], []
        tokens = 0
        offset = self.offset(node.predicate.prompt.template, len(aliases), node.calibration)
        if node.calibration:
            self.offsets[node.predicate.position] = offset
        for item in sorted(tuples, key=lambda t: t[anchor_index]):
            anchor_row = item[anchor_index]
            if node.semantics != "full" and answered.get(anchor_row):
                continue
            margin = predicate_margin(node.predicate.prompt.template,
                                      [texts[a][r] for a, r in zip(aliases, item, strict=True)])
            answer = shapes.predicate_holds(node.predicate, margin, offset)
            answered[anchor_row] = answered.get(anchor_row, False) or answer
            for alias, row in zip(aliases, item, strict=True):
                columns[alias].append(row)
            answers.append(answer)
            margins.append(margin)
            tokens += len(node.prompt(documents[aliases[anchor_index]][anchor_row],
                                      [documents[aliases[p]][item[p]] for p in partners]))
        table = shapes.join_answers(columns, answers, margins, anchor=node.anchor.alias,
                                    partners=[p.alias for p in node.partners], semantics=node.semantics,
                                    position=node.predicate.position)
        return table, tokens

    def offset(self, template: str, slots: int, calibration: tuple[tuple[int, ...], ...]) -> float:
        """The mean keyword margin of the content-free documents in every slot (0 when not calibrated)."""
        if not calibration:
            return 0.0
        margins = [predicate_margin(template, [self.tokenizer.decode(d)] * slots) for d in calibration]
        return sum(margins) / len(margins)

    def classify(self, node: ph.AiClassify, inputs: NodeInputs) -> tuple[pa.Table, int]:
        documents = inputs.tokens(node.alias)
        texts = self.text(inputs, node.alias)
        rows = inputs.rows(node.alias)
        names = [label.name for label in node.labels]
        all_margins = [classify_margins(names, texts[r]) for r in rows]
        chosen = [names[shapes.choose_label(m)] for m in all_margins]
        tokens = sum(len(node.document_prompt(documents[r])) for r in rows)
        return shapes.label_answers(node.alias, node.output, rows, chosen, all_margins), tokens

    def score(self, node: ph.AiScore, inputs: NodeInputs) -> tuple[pa.Table, int]:
        documents = inputs.tokens(node.alias)
        texts = self.text(inputs, node.alias)
        rows = inputs.rows(node.alias)
        margins = [predicate_margin(node.prompt.template, [texts[r]]) for r in rows]
        tokens = sum(len(node.document_prompt(documents[r])) for r in rows)
        return shapes.score_answers(node.alias, node.output, rows, margins), tokens


    def embed(self, node: ph.AiEmbed, inputs: NodeInputs) -> tuple[pa.Table, int]:
        documents = inputs.tokens(node.alias)
        rows = sorted(documents)
        vectors = [embedded_vector(self.tokenizer.decode(documents[row]), node.dimensions) for row in rows]
        return shapes.embedding_answers(node.alias, rows, vectors), sum(node.positions(documents[r]) for r in rows)

    def generate(self, node: ph.AiGenerate, inputs: NodeInputs) -> tuple[pa.Table, int]:
        """The document's first sentence, token by token until the bound ('length') or its end ('stop')."""
        documents = inputs.tokens(node.alias)
        texts = self.text(inputs, node.alias)
        rows = inputs.rows(node.alias)
        written = [self.tokenizer.encode(self.generated(node, texts[r])) for r in rows]
        kept = [ids[:node.max_tokens] for ids in written]
        finish: list[shapes.Finish] = ["length" if len(ids) > node.max_tokens else "stop" for ids in written]
        tokens = sum(len(node.document_prompt(documents[r])) + len(ids) for r, ids in zip(rows, kept, strict=True))
        return shapes.generation_answers(node.alias, rows, kept, finish), tokens

    @staticmethod
    def generated(node: ph.AiGenerate, document: str) -> str:
        """The text, or for a structured generation the JSON of its schema's fields (`generated_value`)."""
        if node.schema is None:
            return generated_text(document)
        return json.dumps(_filled(node.schema, document))


def _filled(schema: SchemaType, document: str) -> object:
    if schema.kind == "struct":
        return {f.name: _filled(f.type, document) for f in schema.fields}
    if schema.kind == "list":
        assert schema.item is not None
        return [_filled(schema.item, document)]
    return generated_value(schema.kind, document)
