"""RequestExecution: the one model node a request backend (vLLM, SGLang) plans for a whole query.

A serving engine takes whole prompts, so the query's model work is handed over as one node. It
holds the native planner's model steps unchanged — AiFilter stages in the chosen order (preamble,
frame and question ids), AiJoin anchors, partners, labels, frame and answer cue, AiScore questions —
wired by the Recombine and HashJoin steps between them. Rows come in from the Scans (`scan_<alias>`
ports) and, for joins restricted by column equalities, from outer HashJoins over the scans
(`pairs_<k>` ports): the engine process never needs the tables' other columns. Out come the rows the
steps leave (`rows`) and one answer table per model step, named after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from quail.frontend.prompts import AnswerTokens
from quail.logical.expressions import Equality
from quail.physical import nodes as ph
from quail.physical.codecs import register_codec_type
from quail.physical.graph import Edge

FilterStrategy = Literal["operator", "pipelined"]
"""operator: one batch per stage over every live document; pipelined: a document's next stage is
submitted as soon as it answers TRUE, with live documents capped by the engine's KV capacity."""

JoinStrategy = Literal["anchor_major", "suffix_major", "fit"]
"""anchor_major: every partner of an anchor, then the next anchor; suffix_major: one partner of
every anchor per wave; fit: suffix_major when every anchor prefix fits the KV cache at once."""

register_codec_type(AnswerTokens)

_ANSWER_PORTS: Mapping[type[ph.PhysicalNode], ph.PortType] = MappingProxyType({
    ph.AiFilter: ph.PortType.FILTER_ANSWERS,
    ph.AiJoin: ph.PortType.JOIN_ANSWERS,
    ph.AiScore: ph.PortType.SCORES,
})


@register_codec_type
@dataclass(frozen=True)
class EqualityPairs:
    """An outer HashJoin over two scans: the row pairs one column equality keeps."""

    port: str
    equality: Equality


@register_codec_type
@dataclass(frozen=True)
class RequestStrategy:
    """How the engine is fed: the filter and join schedules."""

    filters: FilterStrategy = "pipelined"
    joins: JoinStrategy = "fit"

    def __post_init__(self) -> None:
        if self.filters not in ("operator", "pipelined"):
            raise ValueError(f"filter strategy must be 'operator' or 'pipelined', got {self.filters!r}")
        if self.joins not in ("anchor_major", "suffix_major", "fit"):
            raise ValueError(f"join strategy must be 'anchor_major', 'suffix_major' or 'fit', got {self.joins!r}")


@register_codec_type
@dataclass(frozen=True)
class RequestExecution(ph.PhysicalNode):
    """Every model step of a query, in the planner's order, run as requests on one engine."""

    aliases: tuple[str, ...] = ()
    steps: tuple[ph.PhysicalNode, ...] = ()
    edges: tuple[Edge, ...] = ()
    result: str = ""
    pairs: tuple[EqualityPairs, ...] = ()
    strategy: RequestStrategy = RequestStrategy()
    labels: AnswerTokens = AnswerTokens((), ())

    @property
    def INPUTS(self) -> Mapping[str, ph.PortType]:  # type: ignore[override]
        ports = {f"scan_{alias}": ph.PortType.ROWS for alias in self.aliases}
        ports.update({p.port: ph.PortType.ROWS for p in self.pairs})
        return MappingProxyType(ports)

    @property
    def OUTPUTS(self) -> Mapping[str, ph.PortType]:  # type: ignore[override]
        ports = {"rows": ph.PortType.ROWS}
        ports.update({step.id: _ANSWER_PORTS[type(step)] for step in self.model_steps})
        return MappingProxyType(ports)

    @property
    def is_model_node(self) -> bool:
        return True

    @property
    def model_steps(self) -> tuple[ph.PhysicalNode, ...]:
        return tuple(step for step in self.steps if step.is_model_node)

    @property
    def document_aliases(self) -> tuple[str, ...]:
        """The aliases whose document tokens the steps read (the runner attaches them)."""
        read: list[str] = []
        for step in self.model_steps:
            if isinstance(step, ph.AiJoin):
                names = [step.anchor.alias, *(p.alias for p in step.partners)]
            else:
                names = [getattr(step, "alias", "")]
            read.extend(name for name in names if name not in read)
        return tuple(read)

    def step(self, step_id: str) -> ph.PhysicalNode:
        return next(s for s in self.steps if s.id == step_id)

    def inputs_of(self, step_id: str) -> dict[str, Edge]:
        return {e.target_port: e for e in self.edges if e.target == step_id}

    def describe(self) -> str:
        order = "; ".join(step.describe() for step in self.model_steps)
        return f"RequestExecution [{self.strategy.filters} filters, {self.strategy.joins} joins] {order}"
