"""Physical plan nodes: typed input and output ports; model nodes run on a backend.

Rows flow between nodes as Arrow tables of int32 row positions (within each alias's scan view), one
column per alias, plus AI output columns; model nodes emit answer tables in the standard shapes of
`quail.backends.shapes`; the root `Project` runs the relational tail on DuckDB over the rows, the
AI outputs and the scan views (late materialisation).

The model nodes also own the prompt layout: each builds its own token sequences (document prefix,
question tails, join suffixes, calibration prompts) from the parts the planner bound, and every
backend — native, request engines, the keyword test backend — calls these methods rather than
concatenating parts itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import ClassVar

from quail.data.tokenizer import TokenIds
from quail.logical.expressions import (
    AiPredicate,
    ColumnRef,
    Equality,
    Label,
    OutputColumn,
    PairCondition,
    Prompt,
    Semantics,
)
from quail.prompts import AnswerTokens, filter_prompt, join_prompt
from quail.schemas import SchemaType, json_schema


class PortType(Enum):
    ROWS = "rows"
    FILTER_ANSWERS = "filter_answers"
    JOIN_ANSWERS = "join_answers"
    LABELS = "labels"
    SCORES = "scores"
    GENERATIONS = "generations"
    EMBEDDINGS = "embeddings"
    TABLE = "table"


def _ports(**ports: PortType) -> Mapping[str, PortType]:
    return MappingProxyType(ports)


NO_PORTS: Mapping[str, PortType] = _ports()


@dataclass(frozen=True)
class NodeEstimate:
    """What the planner expects of a node: rows out, fresh tokens, seconds."""

    rows: float | None = None
    tokens: float | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class PhysicalNode:
    """Base of every physical node. `kind` names the node type in codecs and explain."""

    id: str
    estimate: NodeEstimate = field(default_factory=NodeEstimate, compare=False)

    INPUTS: ClassVar[Mapping[str, PortType]] = NO_PORTS
    OPTIONAL_INPUTS: ClassVar[frozenset[str]] = frozenset()
    OUTPUTS: ClassVar[Mapping[str, PortType]] = NO_PORTS

    @property
    def kind(self) -> str:
        return type(self).__name__

    @property
    def is_model_node(self) -> bool:
        """Model nodes run on a backend; the rest run in the generic Arrow runtime."""
        return False

    @property
    def document_aliases(self) -> tuple[str, ...]:
        """Aliases whose documents (token ids) a model node reads; the runner attaches them."""
        return ()

    def describe(self) -> str:
        return self.kind




@dataclass(frozen=True, kw_only=True)
class Scan(PhysicalNode):
    """Every row position of a table's scan view under an alias (after the conditions in `where`)."""

    table: str
    alias: str
    where: str = ""

    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        where = f" WHERE {self.where}" if self.where else ""
        return f"Scan {self.table} AS {self.alias}{where}"


@dataclass(frozen=True, kw_only=True)
class ModelNode(PhysicalNode):
    """A node a backend answers with the model: it lays out its own prompts from `preamble` on."""

    preamble: TokenIds

    @property
    def is_model_node(self) -> bool:
        return True


@dataclass(frozen=True, kw_only=True)
class DocumentNode(ModelNode):
    """A model node over one alias's documents: it reads the rows of `alias` and their `column`."""

    alias: str
    column: ColumnRef

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    @property
    def document_aliases(self) -> tuple[str, ...]:
        return (self.alias,)


@dataclass(frozen=True)
class FilterStage:
    """One predicate of an AiFilter: its question tail after the shared frame."""

    predicate: AiPredicate
    question: TokenIds
    selectivity: float
    assumed_selectivity: bool


@dataclass(frozen=True, kw_only=True)
class AiFilter(DocumentNode):
    """Stages over one alias's documents, in order: [preamble][doc][frame][question_k]."""

    frame: TokenIds
    stages: tuple[FilterStage, ...]
    retain_kv: bool = False
    """Keep each surviving document's KV for a later node over the same documents (a join anchored on them, an
    output of theirs)."""
    retain_all: bool = False
    """With `retain_kv`, keep every document's KV, not only survivors': an AI_FILTER value, whose rows all go on."""
    share_prefixes: bool = False
    calibration: tuple[TokenIds, ...] = ()
    """Content-free documents: when given, a stage holds iff the margin beats their mean margin."""
    answers: AnswerTokens | None = None
    """The TRUE-like and FALSE-like first tokens the margin is read from (for engines that take ids)."""

    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(answers=PortType.FILTER_ANSWERS)

    def prefix(self, document: TokenIds) -> TokenIds:
        """[preamble][document][frame]: what every stage of a document shares."""
        return self.preamble + document + self.frame

    def prompt(self, document: TokenIds, stage: int) -> TokenIds:
        """The whole prompt of stage `stage` (an index into `stages`) for one document."""
        return filter_prompt(self.preamble, document, self.frame, self.stages[stage].question)

    def calibration_prompts(self) -> dict[int, list[TokenIds]]:
        """Per predicate position: its prompt over every content-free document (none when uncalibrated)."""
        return {s.predicate.position: [self.prompt(d, k) for d in self.calibration] for k, s in enumerate(self.stages)}

    def describe(self) -> str:
        order = " → ".join(f"#{s.predicate.position} {s.predicate.prompt.template!r}" for s in self.stages)
        kept = (", keep documents' KV" if self.retain_all else ", keep survivors' KV") if self.retain_kv else ""
        shared = ", borrow shared document prefixes" if self.share_prefixes else ""
        return f"AiFilter {self.alias} stages {order}{kept}{shared}{_calibrated(self.calibration)}"


def _kept(retain: bool) -> str:
    return ", keep document KV for a later node" if retain else ""


def _calibrated(documents: tuple[TokenIds, ...]) -> str:
    return f", calibrated on {len(documents)} content-free documents" if documents else ""


@dataclass(frozen=True, kw_only=True)
class AiJoin(ModelNode):
    """Anchored evaluation of candidate tuples: anchor prefix once, one suffix per tuple.

    The prompt of a tuple is preamble + anchor doc + frame + Σ(labels[j] + partner doc j) + cue.
    `candidates`, when connected, lists the tuples to evaluate (from equality restrictions);
    otherwise every pair of left and right rows is a candidate.
    """

    predicate: AiPredicate
    anchor: ColumnRef
    partners: tuple[ColumnRef, ...]
    semantics: Semantics = "full"
    frame: TokenIds
    labels: tuple[TokenIds, ...]
    cue: TokenIds
    selectivity: float = 0.2
    assumed_selectivity: bool = True
    retain_anchor_kv: bool = False
    share_prefixes: bool = False
    """Anchors borrow the document prefixes they share with anchors computed before them."""
    calibration: tuple[TokenIds, ...] = ()
    """Content-free documents for every slot: a tuple holds iff its margin beats their mean margin."""
    answers: AnswerTokens | None = None

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(left=PortType.ROWS, right=PortType.ROWS,
                                                      candidates=PortType.ROWS)
    OPTIONAL_INPUTS: ClassVar[frozenset[str]] = frozenset({"candidates"})
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(answers=PortType.JOIN_ANSWERS)

    @property
    def document_aliases(self) -> tuple[str, ...]:
        return (self.anchor.alias, *(p.alias for p in self.partners))

    def anchor_prefix(self, document: TokenIds) -> TokenIds:
        """[preamble][anchor document][frame]: computed once per anchor, shared by its partners."""
        return self.preamble + document + self.frame

    def suffix(self, partners: Sequence[TokenIds]) -> TokenIds:
        """[label 1][partner 1]…[cue]: what is new per candidate tuple (partners in `partners` order)."""
        return join_prompt((), (), (), self.labels, partners, self.cue)

    def prompt(self, anchor: TokenIds, partners: Sequence[TokenIds]) -> TokenIds:
        return join_prompt(self.preamble, anchor, self.frame, self.labels, partners, self.cue)

    def calibration_prompts(self) -> dict[int, list[TokenIds]]:
        """The predicate's prompt with one content-free document in every slot, per content-free document."""
        slots = len(self.labels)
        return {self.predicate.position: [self.prompt(d, [d] * slots) for d in self.calibration]}

    def describe(self) -> str:
        partners = ", ".join(p.alias for p in self.partners)
        kept = ", keep anchor KV for the next join" if self.retain_anchor_kv else ""
        shared = ", anchors borrow shared document prefixes" if self.share_prefixes else ""
        head = f"AiJoin {self.semantics} #{self.predicate.position} anchor {self.anchor.alias}"
        return f"{head} partners {partners}{kept}{shared}{_calibrated(self.calibration)}"


@dataclass(frozen=True, kw_only=True)
class AiClassify(DocumentNode):
    """One label per row: the label whose continuation has the highest summed log-probability."""

    output: str
    position: int
    labels: tuple[Label, ...]
    tail: TokenIds
    label_tokens: tuple[TokenIds, ...]
    retain_kv: bool = False
    """Keep each document's KV for a later node over the same documents (an engine that keeps KV takes a document's
    from an earlier node when it has it, whatever this says)."""

    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(answers=PortType.LABELS)

    def document_prompt(self, document: TokenIds) -> TokenIds:
        """[preamble][document][tail]: the first token of every label is read after it."""
        return filter_prompt(self.preamble, document, (), self.tail)

    def describe(self) -> str:
        return (f"AiClassify #{self.position} {self.alias} AS {self.output} [{', '.join(x.name for x in self.labels)}]"
                f"{_kept(self.retain_kv)}")


@dataclass(frozen=True, kw_only=True)
class AiScore(DocumentNode):
    """Sigmoid of the TRUE−FALSE margin per row; one alias's document in the filter layout."""

    output: str
    position: int
    prompt: Prompt
    question: TokenIds
    answers: AnswerTokens | None = None
    retain_kv: bool = False
    """Keep each document's KV for a later node over the same documents."""

    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(answers=PortType.SCORES)

    def document_prompt(self, document: TokenIds) -> TokenIds:
        """[preamble][document][question]: the score is read at its last token."""
        return filter_prompt(self.preamble, document, (), self.question)

    def describe(self) -> str:
        return f"AiScore #{self.position} {self.alias} AS {self.output}{_kept(self.retain_kv)}"


@dataclass(frozen=True, kw_only=True)
class AiGenerate(DocumentNode):
    """Greedy text per row: [preamble][document][tail], then the model's own tokens — at most `max_tokens`, ending
    before the first of `stop` (end of text or of the turn)."""

    output: str
    position: int
    prompt: Prompt
    tail: TokenIds
    max_tokens: int
    stop: TokenIds
    schema: SchemaType | None = None
    """A structured generation is held to this schema's JSON (`grammar`); None: free text."""
    retain_kv: bool = False
    """Keep each document's KV for a later node over the same documents (an engine that keeps KV takes a
    document's from an earlier node when it has it, whatever this says)."""

    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(answers=PortType.GENERATIONS)

    @property
    def grammar(self) -> str | None:
        """The JSON Schema a backend's grammar library compiles (every field required, nothing else), written
        compactly: `x-guidance` (llguidance's own key, which vLLM's guidance backend passes on) rules out
        whitespace between tokens, which a weak model would otherwise write until the bound."""
        if self.schema is None:
            return None
        return json.dumps({**json_schema(self.schema), "x-guidance": {"whitespace_flexible": False}})

    def document_prompt(self, document: TokenIds) -> TokenIds:
        """[preamble][document][tail]: the first generated token is read after it."""
        return filter_prompt(self.preamble, document, (), self.tail)

    def describe(self) -> str:
        return (f"AiGenerate #{self.position} {self.alias} AS {self.output} (at most {self.max_tokens} tokens)"
                f"{_kept(self.retain_kv)}")


@dataclass(frozen=True, kw_only=True)
class AiEmbed(DocumentNode):
    """One vector per row from an embedding model: the encoder reads the document's ids (the first its model's
    context holds, with the special tokens it adds itself) and pools them into `dimensions` numbers."""

    output: str
    dimensions: int
    context: int
    """Positions the encoder reads at most, its special tokens included: a longer document is embedded from its
    first `context - special_tokens` ids."""
    special_tokens: int

    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(answers=PortType.EMBEDDINGS)

    def positions(self, document: TokenIds) -> int:
        """The positions the encoder computes for one document."""
        return min(len(document) + self.special_tokens, self.context)

    def describe(self) -> str:
        return f"AiEmbed {self.alias} AS {self.output} ({self.dimensions} dimensions)"


@dataclass(frozen=True, kw_only=True)
class HashJoin(PhysicalNode):
    """Rows of left and right whose columns are equal (Acero hash join on the equalities)."""

    equalities: tuple[Equality, ...]
    conditions: tuple[PairCondition, ...] = ()
    """Conditions over the two sides' columns the pairs must also satisfy (DuckDB enumerates them)."""

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(left=PortType.ROWS, right=PortType.ROWS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        on = " AND ".join([*(str(e) for e in self.equalities), *(str(c) for c in self.conditions)]) or "cross product"
        return f"HashJoin {on}"


@dataclass(frozen=True, kw_only=True)
class RecombineFilter(PhysicalNode):
    """Rows whose every filter answer is TRUE."""

    alias: str

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS, answers=PortType.FILTER_ANSWERS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        return f"Recombine filter {self.alias}"


@dataclass(frozen=True, kw_only=True)
class RecombineJoin(PhysicalNode):
    """Left ⋈ right through the TRUE join answers (full), left rows with / without one (exists / anti),
    or every left row with its TRUE partners and NULLs where it has none (left).

    `candidates`, when connected, holds the left × right rows that satisfy the join's column equalities:
    the answers are joined through them, never through every left × right pair, because an equality may
    read an alias the AI predicate does not (answers are keyed by the predicate's aliases only)."""

    semantics: Semantics

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(left=PortType.ROWS, right=PortType.ROWS,
                                                      answers=PortType.JOIN_ANSWERS, candidates=PortType.ROWS)
    OPTIONAL_INPUTS: ClassVar[frozenset[str]] = frozenset({"candidates"})
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        return f"Recombine join ({self.semantics})"


@dataclass(frozen=True, kw_only=True)
class RecombineLabels(PhysicalNode):
    """Adds a classification's label column (NULL where unanswered); keeps only `allowed` labels when given."""

    alias: str
    output: str
    allowed: tuple[str, ...] | None = None

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS, answers=PortType.LABELS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        keep = f" keep IN ({', '.join(self.allowed)})" if self.allowed is not None else ""
        return f"Recombine labels {self.output}{keep}"


@dataclass(frozen=True, kw_only=True)
class RecombineScores(PhysicalNode):
    """Adds a score column (NULL where unanswered)."""

    alias: str
    output: str

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS, answers=PortType.SCORES)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        return f"Recombine scores {self.output}"


@dataclass(frozen=True, kw_only=True)
class RecombineTexts(PhysicalNode):
    """Adds a generated text column (NULL where unanswered); with a schema, the text is read into its fields where
    the query was asked."""

    alias: str
    output: str
    schema: SchemaType | None = None

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS, answers=PortType.GENERATIONS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        return f"Recombine texts {self.output}"


@dataclass(frozen=True, kw_only=True)
class RecombineEmbeddings(PhysicalNode):
    """Adds an embedding column (NULL where unanswered)."""

    alias: str
    output: str

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS, answers=PortType.EMBEDDINGS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        return f"Recombine embeddings {self.output}"


@dataclass(frozen=True, kw_only=True)
class RecombineVerdicts(PhysicalNode):
    """Adds a one-stage filter's answers as a BOOLEAN column (NULL where it did not answer); drops no row."""

    alias: str
    output: str

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS, answers=PortType.FILTER_ANSWERS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        return f"Recombine verdicts {self.output}"


@dataclass(frozen=True, kw_only=True)
class DropNullDocuments(PhysicalNode):
    """A model node's input: without the rows whose document is NULL for one of `aliases` (or whose row
    is NULL, outside a LEFT JOIN's matches) — an AI function of NULL is NULL, so the model never sees
    them. `distinct` keeps each document of the one alias once (an AI output is computed once per document)."""

    aliases: tuple[str, ...]
    distinct: bool = False

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        what = "Each document of" if self.distinct else "Skip NULL documents of"
        return f"{what} {', '.join(self.aliases)}"


@dataclass(frozen=True, kw_only=True)
class Project(PhysicalNode):
    """The relational tail: `statement` on DuckDB, reading alias `relations[i]` as `__quail_rows_<i>`
    (its scan view's rows at the positions of the input) and the AI outputs as columns of `__quail`."""

    columns: tuple[OutputColumn, ...]
    statement: str
    relations: tuple[str, ...]

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(table=PortType.TABLE)

    def describe(self) -> str:
        return f"Project [{', '.join(c.name for c in self.columns)}] on DuckDB: {self.statement}"


@dataclass(frozen=True, kw_only=True)
class Limit(PhysicalNode):
    count: int

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)

    def describe(self) -> str:
        return f"Limit {self.count}"


@dataclass(frozen=True, kw_only=True)
class Barrier(PhysicalNode):
    """Materialises its input before anything downstream starts (a pipeline breaker)."""

    INPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)
    OUTPUTS: ClassVar[Mapping[str, PortType]] = _ports(rows=PortType.ROWS)


MODEL_NODE_TYPES: tuple[type[PhysicalNode], ...] = (AiFilter, AiJoin, AiClassify, AiScore, AiGenerate)
CORE_NODE_TYPES: tuple[type[PhysicalNode], ...] = (
    Scan, AiFilter, AiJoin, AiClassify, AiScore, AiGenerate, AiEmbed, HashJoin, RecombineFilter, RecombineJoin,
    RecombineLabels, RecombineScores, RecombineTexts, RecombineEmbeddings, RecombineVerdicts, DropNullDocuments,
    Project, Limit, Barrier,
)
