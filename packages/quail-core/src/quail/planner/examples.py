"""Where a model node's few-shot examples go — decided once per plan, read by pricing and by the physical plan.

`first`: in the preamble every document of the node shares, computed once per query; the documents' KV then holds
the examples, so KV another node would reuse (a join anchored on the alias) must be computed again, and the
preamble differs from every other node's. `after`: in each question tail, once per document and question; the
document's KV is the one every other node reads. The cheaper in tokens wins; questions of one node with different
examples can only take theirs after the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quail.data.tokenizer import Tokenizer
from quail.logical.expressions import Prompt
from quail.prompts import (
    EXAMPLES_AFTER_HEADER,
    EXAMPLES_FIRST_HEADER,
    ExamplesLayout,
    examples_text,
    shared_examples,
)

LayoutKey = tuple[str, str | int]
"""("filter", alias) for an alias's filter node, ("output", position) for an AI output column."""


@dataclass(frozen=True)
class LayoutChoice:
    layout: ExamplesLayout
    remark: str | None = None


def choose_layout(prompts: Sequence[Prompt], documents: float, document_tokens: float, reused: bool,
                  tokenizer: Tokenizer, what: str) -> LayoutChoice:
    """The layout of one node's prompts over `documents` documents of `document_tokens` tokens in all; `reused`
    when another node of the plan may read the same documents' KV."""
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
