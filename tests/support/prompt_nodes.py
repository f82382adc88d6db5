"""Physical model nodes built straight from prompt bindings: the nodes lay the bound parts out."""

from __future__ import annotations

from collections.abc import Sequence

from quail.data.tokenizer import Tokenizer
from quail.logical.expressions import AiPredicate
from quail.physical import nodes as ph
from quail.prompts import BASE_STYLE, PromptStyle, bind_filters, bind_join


def filter_node(predicates: Sequence[AiPredicate], tokenizer: Tokenizer, style: PromptStyle = BASE_STYLE
                ) -> ph.AiFilter:
    """The AiFilter the planner makes of these stages, in this order."""
    bound = bind_filters(predicates, tokenizer, style)
    stages = tuple(ph.FilterStage(p, q, 0.2, True) for p, q in zip(predicates, bound.questions, strict=True))
    return ph.AiFilter("filter", alias=bound.alias, column=bound.column, preamble=bound.preamble, frame=bound.frame,
                       stages=stages)


def join_node(predicate: AiPredicate, anchor: str, tokenizer: Tokenizer, style: PromptStyle = BASE_STYLE
              ) -> ph.AiJoin:
    """The AiJoin the planner makes of this predicate anchored on `anchor`."""
    bound = bind_join(predicate, anchor, tokenizer, style)
    return ph.AiJoin("join", predicate=predicate, anchor=bound.anchor, partners=bound.partners,
                     preamble=bound.preamble, frame=bound.frame, labels=bound.labels, cue=bound.cue)
