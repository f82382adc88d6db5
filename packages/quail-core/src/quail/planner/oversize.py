"""Documents too long for one forward pass: refuse the query (the default), skip them, or truncate them.

A prompt is its documents plus the layout's text around them (preamble, frame, question, labels,
cue), and all of it must fit min(chunk_tokens, the model's context). The limit of an alias is the
longest document every prompt over it can hold: for a prompt over one document, the budget less
the text around it; for a join prompt over several, the documents share what the text leaves by
water-filling — the longest are cut to one common length, so the worst combination fits.

The decision is made here, in core, before any backend plans: a skipped row leaves the query's
scan, a truncated document is cut to its first `limit` tokens, and the planner and every backend
see only that. Under "refuse" nothing changes and the planner refuses as it always has.
The limits take the wordier of the base layout and the model's own (its chat turn), so they may
be a few tokens stricter than one backend needs; they are never looser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from quail.catalog.models import ModelSpec
from quail.config import OversizedPolicy
from quail.data.tokenizer import Tokenizer
from quail.data.tokens import TokenColumn
from quail.logical.expressions import AiPredicate
from quail.logical.nodes import Classify, Generate, LogicalNode, Score, SemanticFilter, SemanticJoin, Verdict, walk
from quail.prompts import (
    BASE_STYLE,
    ExamplesLayout,
    PromptStyle,
    bind_classify,
    bind_filters,
    bind_generate,
    bind_join,
    shared_examples,
    style_for,
)

ReportValue = None | bool | int | float | str | list["ReportValue"] | dict[str, "ReportValue"]


@dataclass(frozen=True)
class PromptSpace:
    """The documents one prompt reads and the tokens its own text takes."""

    aliases: tuple[str, ...]
    overhead: int


@dataclass(frozen=True)
class OversizedDocuments:
    """Which rows are over their alias's limit, and what the policy does with them."""

    policy: OversizedPolicy
    limits: Mapping[str, int] = field(default_factory=dict)
    rows: Mapping[str, pa.Array] = field(default_factory=dict)
    longest: Mapping[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {alias: len(rows) for alias, rows in sorted(self.rows.items())}

    def apply(self, tokens: Mapping[str, TokenColumn]) -> tuple[dict[str, TokenColumn], dict[str, pa.Array]]:
        """(token columns, rows left out per alias) that the planner and the runner should see."""
        if self.policy == "truncate":
            cut = {alias: column.truncated(self.limits[alias]) if alias in self.rows else column
                   for alias, column in tokens.items()}
            return cut, {}
        if self.policy == "skip":
            return dict(tokens), dict(self.rows)
        return dict(tokens), {}

    def remarks(self) -> tuple[str, ...]:
        done = "skipped" if self.policy == "skip" else "truncated to their first"
        remarks = []
        for alias, count in self.counts().items():
            limit = f"{self.limits[alias]:,}"
            what = f"{done} {limit} tokens" if self.policy == "truncate" else f"{done} (over {limit} tokens)"
            remarks.append(f"oversized_documents={self.policy!r}: {count} document(s) of {alias} {what}; "
                           f"the longest has {self.longest[alias]:,} tokens")
        return tuple(remarks)

    def report(self) -> dict[str, ReportValue]:
        counts: dict[str, ReportValue] = dict(self.counts())
        limits: dict[str, ReportValue] = {alias: self.limits[alias] for alias in sorted(self.rows)}
        return {"policy": self.policy, "documents": counts, "limit_tokens": limits}


def taking_part(column: TokenColumn, skipped: pa.Array | None) -> list[int]:
    """Token counts of the documents a query reads: the planner's statistics leave skipped rows and NULL
    texts (no document, no model work) out."""
    lengths, kept = column.lengths(), column.present()
    if skipped is not None and len(skipped):
        kept = pc.and_(kept, pc.invert(pc.is_in(pa.array(range(len(lengths)), pa.int32()), value_set=skipped)))
    return lengths.filter(kept).to_pylist()


def find_oversized(policy: OversizedPolicy, plan: LogicalNode, tokens: Mapping[str, TokenColumn],
                   tokenizer: Tokenizer, model: ModelSpec, chunk_tokens: int) -> OversizedDocuments:
    """The rows over their alias's limit (none looked for under "refuse": the planner refuses as before)."""
    if policy == "refuse" or not tokens:
        return OversizedDocuments(policy)
    budget = min(chunk_tokens, model.context_length)
    styles = _layouts(model, tokenizer)
    lengths = {alias: column.lengths() for alias, column in tokens.items()}
    maxima = {alias: pc.max(values).as_py() or 0 for alias, values in lengths.items()}
    limits = document_limits(prompt_spaces(plan, tokenizer, styles), maxima, budget)
    rows, longest = {}, {}
    for alias, limit in limits.items():
        over = pc.indices_nonzero(pc.greater(lengths[alias], limit)).cast(pa.int32())
        if len(over):
            rows[alias], longest[alias] = over, maxima[alias]
    return OversizedDocuments(policy, limits, rows, longest)


def _layouts(model: ModelSpec, tokenizer: Tokenizer) -> tuple[PromptStyle, ...]:
    """The base layout, and the model's chat layout where this tokenizer has its turn markers (a test
    backend's byte tokenizer has none, and lays every model out in the base layout)."""
    chat = style_for(model.chat_template, model.architecture)
    if chat is BASE_STYLE or any(tokenizer.token_id(token) is None for token in chat.control_tokens):
        return (BASE_STYLE,)
    return BASE_STYLE, chat


def document_limits(spaces: Iterable[PromptSpace], maxima: Mapping[str, int], budget: int) -> dict[str, int]:
    """alias → the longest document (tokens) that every prompt over it can hold.

    Prompts over one document leave it the budget less their text; a join prompt's documents
    share what its text leaves, the longest cut to one common length. A prompt whose own text
    leaves no token per document limits nothing: no document could run, so the planner refuses.
    """
    limits = dict(maxima)
    for space in sorted(spaces, key=lambda s: len(s.aliases)):
        room = budget - space.overhead
        if room < len(space.aliases):
            continue
        level = _water_level([limits[a] for a in space.aliases], room)
        for alias in space.aliases:
            limits[alias] = min(limits[alias], level)
    return limits


def _water_level(lengths: list[int], room: int) -> int:
    """The largest L with Σ min(length, L) ≤ room (every length when they all fit)."""
    if sum(lengths) <= room:
        return max(lengths, default=0)
    remaining, ordered = room, sorted(lengths)
    for index, length in enumerate(ordered):
        share = remaining // (len(ordered) - index)
        if length > share:
            return share
        remaining -= length
    return ordered[-1]


def prompt_spaces(plan: LogicalNode, tokenizer: Tokenizer, styles: tuple[PromptStyle, ...]) -> list[PromptSpace]:
    """Every prompt the plan asks, by the documents it reads and its own text (the wordiest style)."""
    spaces = []
    for node in walk(plan):
        if isinstance(node, SemanticFilter):
            spaces.append(PromptSpace((node.alias,), max(_filter_text(node.predicates, tokenizer, s) for s in styles)))
        elif isinstance(node, SemanticJoin):
            spaces.append(PromptSpace(node.predicate.aliases,
                                      max(_join_text(node.predicate, tokenizer, s) for s in styles)))
        elif isinstance(node, Classify):
            spaces.append(PromptSpace(node.prompt.aliases, max(_classify_text(node, tokenizer, s) for s in styles)))
        elif isinstance(node, Score | Verdict):
            spaces.append(PromptSpace(node.prompt.aliases, max(
                _filter_text((AiPredicate(node.prompt, node.position),), tokenizer, s) for s in styles)))
        elif isinstance(node, Generate):
            spaces.append(PromptSpace(node.prompt.aliases, max(_generate_text(node, tokenizer, s) for s in styles)))
    return spaces


def _generate_text(node: Generate, tokenizer: Tokenizer, style: PromptStyle) -> int:
    """The prompt's own text and every token the generation may write: they all share the context."""
    bound = bind_generate(node.prompt, tokenizer, style, node.schema)
    return len(bound.preamble) + len(bound.tail) + node.max_tokens


LAYOUTS: tuple[ExamplesLayout, ...] = ("document_first", "examples_first")


def _filter_text(predicates: tuple[AiPredicate, ...], tokenizer: Tokenizer, style: PromptStyle) -> int:
    """The wordiest of the layouts the node may get (examples first or after, the question first for one question):
    the plan has not chosen yet."""
    layouts = LAYOUTS if shared_examples([p.prompt for p in predicates]) else LAYOUTS[:1]
    if len(predicates) == 1:
        layouts = (*layouts, "instruction_first")
    return max(_filter_layout_text(predicates, tokenizer, style, layout) for layout in layouts)


def _filter_layout_text(predicates: tuple[AiPredicate, ...], tokenizer: Tokenizer, style: PromptStyle,
                        layout: ExamplesLayout) -> int:
    bound = bind_filters(predicates, tokenizer, style, layout)
    return len(bound.preamble) + len(bound.frame) + max(len(q) for q in bound.questions)


def _join_text(predicate: AiPredicate, tokenizer: Tokenizer, style: PromptStyle) -> int:
    """The text of the cheapest anchor the planner may choose: it keeps an anchor whose tuples fit."""
    anchors = (predicate.anchor,) if predicate.anchor else tuple(sorted(set(predicate.aliases)))
    texts = []
    for anchor in anchors:
        bound = bind_join(predicate, anchor, tokenizer, style)
        texts.append(len(bound.preamble) + len(bound.frame) + sum(map(len, bound.labels)) + len(bound.cue))
    return min(texts)


def _classify_text(node: Classify, tokenizer: Tokenizer, style: PromptStyle) -> int:
    layouts = (*(LAYOUTS if node.prompt.examples else LAYOUTS[:1]), "instruction_first")
    return max(_classify_layout_text(node, tokenizer, style, layout) for layout in layouts)


def _classify_layout_text(node: Classify, tokenizer: Tokenizer, style: PromptStyle, layout: ExamplesLayout) -> int:
    bound = bind_classify(node.prompt, node.labels, node.instructions, tokenizer, style, layout)
    return len(bound.preamble) + len(bound.tail) + max((len(label) for label in bound.labels), default=0)
