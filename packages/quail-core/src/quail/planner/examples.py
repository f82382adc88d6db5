"""Where a model node's few-shot examples — or its one long question — go: decided once per plan, read by pricing
and by the physical plan.

`first`: in the preamble every document of the node shares, computed once per query; the documents' KV then holds
the examples, so KV another node would reuse (a join anchored on the alias) must be computed again, and the
preamble differs from every other node's. `after`: in each question tail, once per document and question; the
document's KV is the one every other node reads. The cheaper in tokens wins; questions of one node with different
examples can only take theirs after the document. A node that asks each document one question without examples
puts that question first (`instruction_first`) when it is the long shared part: a rubric over short reviews.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quail.config import Switch
from quail.data.tokenizer import Tokenizer
from quail.logical.expressions import Prompt
from quail.prompts import (
    DOCUMENT_PLACEHOLDER,
    EXAMPLES_AFTER_HEADER,
    EXAMPLES_FIRST_HEADER,
    ExamplesLayout,
    examples_text,
    filter_tail,
    instruction_text,
    question_text,
    shared_examples,
)

QUESTION_FIRST_GAIN = 0.5
"""A node's question goes before its documents (without examples) only when that leaves at most this share of the
node's prompt tokens: a long instruction over short documents, not a short question over long ones."""

LayoutKey = tuple[str, str | int]
"""("filter", alias) for an alias's filter node, ("output", position) for an AI output column."""


@dataclass(frozen=True)
class LayoutChoice:
    layout: ExamplesLayout
    remark: str | None = None


def choose_layout(prompts: Sequence[Prompt], documents: float, document_tokens: float, reused: bool,
                  tokenizer: Tokenizer, what: str, question_first: Switch = "auto") -> LayoutChoice:
    """The layout of one node's prompts over `documents` documents of `document_tokens` tokens in all; `reused`
    when another node of the plan may read the same documents' KV."""
    if len(prompts) == 1 and not prompts[0].examples and question_first != "off":
        return _one_question(prompts[0], documents, document_tokens, reused, tokenizer, what, question_first == "on")
    if not any(prompt.examples for prompt in prompts):
        return LayoutChoice("document_first")
    examples = shared_examples(prompts)
    if examples is None:
        return LayoutChoice("document_first", f"examples of {what}: after each document (its questions carry "
                                              "different examples, which no one shared prefix can hold)")
    first = len(tokenizer.encode(EXAMPLES_FIRST_HEADER + examples_text(examples)))
    after = len(tokenizer.encode(EXAMPLES_AFTER_HEADER + examples_text(examples)))
    after_cost = after * documents * len(prompts)
    first_cost = first + (document_tokens if reused else 0.0)
    again = f" + {document_tokens:,.0f} of documents another node would reuse" if reused else ""
    costs = (f"first: {first_cost:,.0f} tokens ({first:,} once{again}); after each document: {after_cost:,.0f} "
             f"({after:,} × {documents:,.0f} documents × {len(prompts)} question{'s' if len(prompts) > 1 else ''})")
    layout: ExamplesLayout = "examples_first" if first_cost <= after_cost else "document_first"
    where = "first, a prefix every document shares" if layout == "examples_first" else "after each document"
    return LayoutChoice(layout, f"examples of {what}: {where} — {costs}")


def _one_question(prompt: Prompt, documents: float, document_tokens: float, reused: bool, tokenizer: Tokenizer,
                  what: str, forced: bool) -> LayoutChoice:
    """A node asking each document one question (without examples): the question once, before the documents, when
    that is clearly cheaper in tokens than after each document (a document whose KV another node reads counts
    again when the question comes first)."""
    after = len(tokenizer.encode(filter_tail(prompt)))
    first = len(tokenizer.encode(instruction_text(question_text(prompt, {0: DOCUMENT_PLACEHOLDER}))))
    cue = len(tokenizer.encode(filter_tail(prompt, layout="instruction_first")))
    after_cost = after * documents
    first_cost = first + cue * documents + (document_tokens if reused else 0.0)
    if not forced and first_cost + document_tokens > QUESTION_FIRST_GAIN * (after_cost + document_tokens):
        return LayoutChoice("document_first")  # not clearly cheaper: the layout every other node shares stays
    again = f" + {document_tokens:,.0f} of documents another node would reuse" if reused else ""
    return LayoutChoice("instruction_first", f"the question of {what}: first, a prefix every document shares — "
                                             f"{first_cost:,.0f} tokens ({first:,} once + {cue:,} × {documents:,.0f}"
                                             f"{again}); after each document: {after_cost:,.0f} ({after:,} × "
                                             f"{documents:,.0f})")
