"""Prices of work the answer store already holds: stored answers cost nothing, stored FALSEs drop documents.

The optimizer asks here, per filter stage, join anchor and AI output, how much is still to compute;
without a store (`PlanningContext.stored_answers` None) everything is. Decisions are remarked so
explain() says what the store saved.
"""

from __future__ import annotations

from functools import partial

from quail.backends.base import PlanningContext
from quail.data.tokenizer import TokenIds, Tokenizer
from quail.logical.expressions import AiPredicate
from quail.logical.nodes import Classify, Score
from quail.planner.cost import Lengths
from quail.prompts import (
    ExamplesLayout,
    FilterPrompts,
    JoinPrompt,
    PromptStyle,
    bind_classify,
    bind_filters,
    filter_prompt,
    join_prompt,
)


class StoredPrices:
    """What the store leaves to compute for one plan; remarks go to the optimizer's list."""

    def __init__(self, context: PlanningContext, tokenizer: Tokenizer, style: PromptStyle,
                 remarks: list[str]) -> None:
        self.stored = context.stored_answers
        self.tokenizer = tokenizer
        self.style = style
        self.remarks = remarks
        self.shares: dict[tuple[int, str], float] = {}

    def pending_stages(self, alias: str, predicates: tuple[AiPredicate, ...], bound: FilterPrompts,
                       documents: Lengths) -> list[Lengths]:
        """Per predicate, the documents it still has to read: all of them, less what the store holds."""
        if self.stored is None:
            return [documents] * len(predicates)
        stages = [(p, partial(_stage_prompt, bound, k)) for k, p in enumerate(predicates)]
        pending = [Lengths.of(lengths) for lengths in self.stored.pending_stages(alias, stages)]
        if any(todo.count < documents.count for todo in pending):
            counts = ", ".join(f"#{p.position} {todo.count:.0f}" for p, todo in zip(predicates, pending, strict=True))
            self.remarks.append(f"answer store: of {documents.count:.0f} documents of {alias}, still to compute "
                                f"{counts} (stored answers and repeated documents cost nothing; a stored FALSE "
                                f"drops its document)")
        return pending

    def join_share(self, position: int, bound: JoinPrompt) -> float:
        """The share of a join's tuples whose answers are stored (sampled once per predicate and anchor)."""
        if self.stored is None:
            return 0.0
        key = (position, bound.anchor.alias)
        if key not in self.shares:
            aliases = [bound.anchor.alias, *(p.alias for p in bound.partners)]
            self.shares[key] = self.stored.stored_share(aliases, lambda docs: join_prompt(
                bound.preamble, docs[0], bound.frame, bound.labels, docs[1:], bound.cue))
            if self.shares[key]:
                self.remarks.append(f"answer store: ≈{self.shares[key]:.0%} of join #{position}'s tuples anchored on "
                                    f"{bound.anchor.alias} are stored (priced at zero)")
        return self.shares[key]

    def output_share(self, output: Classify | Score, documents: float, layout: ExamplesLayout) -> float:
        """The share of an AI output's `documents` whose readout is not stored (1 without a store), its examples
        laid out as the plan lays them."""
        alias = output.prompt.aliases[0]
        if self.stored is None or not documents:
            return 1.0
        if isinstance(output, Classify):
            bound = bind_classify(output.prompt, output.labels, output.instructions, self.tokenizer, self.style,
                                  layout)
            pending = self.stored.pending_labels(
                alias, lambda document: filter_prompt(bound.preamble, document, (), bound.tail), bound.labels)
        else:
            predicate = AiPredicate(output.prompt, output.position)
            prompts = bind_filters([predicate], self.tokenizer, self.style, layout)
            [pending] = self.stored.pending_stages(alias, [(predicate, partial(_stage_prompt, prompts, 0))])
        return len(pending) / documents


def _stage_prompt(bound: FilterPrompts, stage: int, document: TokenIds) -> TokenIds:
    return filter_prompt(bound.preamble, document, bound.frame, bound.questions[stage])
