"""The classify / score scheduler: [document][tail] per row; labels longer than one token continue from it —
in the same pass, reading its rows there (`Item.lender`), when they all fit; else from its kept KV after."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from quail_native.executor.packing import Item, ItemResult
from quail_native.executor.state import Batch, SharedState, Tokens, drop, run_passes


@dataclass(eq=False)
class LabelDocument:
    row: int
    document: Tokens
    tokens: Tokens
    """[document][tail]."""
    block: int | None = None
    """The KV its label continuations read after the preamble: [document][tail] — or [tail] alone after `lent`."""
    lent: int | None = None
    """The document's KV, kept by an earlier node (`SharedState.take`) or by this one for a later node."""
    scores: list[float] = field(default_factory=list)
    waiting: int = 0
    riding: bool = False
    """Its label continuations run in its own pass (so its KV is not kept)."""


@dataclass(frozen=True)
class LabelLayout:
    preamble: Tokens
    tail: Tokens
    labels: tuple[Tokens, ...]
    retain: bool = False
    """Keep each document's KV for a later node over the same documents."""


LabelTag = tuple[LabelDocument, int | None]
"""A document's [doc][tail] item (None) or the continuation of one of its multi-token labels."""

LabelReader = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""log p(targets[r, j] | row r) for hidden rows [rows, hidden] and targets [rows, k]
(`readout.log_probabilities` over the engine's model)."""

READ_ROWS = 128
"""Read rows per `read` call: a full-vocabulary call holds [rows, vocabulary] fp32 logits (128 × 262k:
134 MB), so a pass of many short documents is read in slices of this many rows."""


def run_labels(state: SharedState, alias: str, rows: Sequence[int], documents: dict[int, Tokens],
               layout: LabelLayout, read: LabelReader) -> dict[int, list[float]]:
    """Per row, each label's log-probability: the first token read after [doc][tail], the rest (labels of
    two or more tokens) from a continuation over the kept [doc][tail] KV — all packed many to a pass.

    A pass's answers are read together once it has run: the full-vocabulary head (classification needs
    the normaliser) is then one GEMM over all of its read rows instead of one per row, which on a CPU
    reads the 262k-row head once per pass rather than once per document."""
    pre = state.preamble(layout.preamble)
    start = len(layout.preamble)
    longer = [k for k, label in enumerate(layout.labels) if len(label) > 1]
    continued = sum(len(layout.labels[k]) - 1 for k in longer)
    fresh = deque(LabelDocument(r, documents[r], documents[r] + layout.tail) for r in rows)
    ready: deque[tuple[LabelDocument, int]] = deque()
    out: dict[int, list[float]] = {}

    def parents(doc: LabelDocument) -> tuple[int, ...]:
        return (pre,) if doc.lent is None else (pre, doc.lent)

    def continuation(doc: LabelDocument, k: int, lender: Item | None = None) -> Item:
        """Label k's tokens after the document: over its kept KV, or riding on its item `lender`."""
        label = layout.labels[k]
        if lender is not None:
            return Item(label[:-1], start + len(doc.tokens), (pre,), tuple(range(len(label) - 1)), (), lender,
                        len(doc.tokens))
        assert doc.block is not None
        return Item(label[:-1], start + len(doc.tokens), (*parents(doc), doc.block), tuple(range(len(label) - 1)))

    def first_item(doc: LabelDocument, keep_rest: bool) -> Item:
        """[document][tail] after the preamble — or [tail] over the document's kept KV — keeping the document's KV
        apart when a later node reads it, and what the continuations read when they run in a later pass."""
        if doc.lent is not None:
            tail = layout.tail
            return Item(tail, start + len(doc.document), parents(doc), (len(tail) - 1,),
                        ((0, len(tail)),) if keep_rest else ())
        document = len(doc.document)
        if layout.retain and document:
            spans = ((0, document), (document, len(layout.tail))) if keep_rest else ((0, document),)
        else:
            spans = ((0, len(doc.tokens)),) if keep_rest else ()
        return Item(doc.tokens, start, (pre,), (len(doc.tokens) - 1,), spans)

    def fill(batch: Batch[LabelTag]) -> None:
        """Kept documents' label continuations, then fresh documents — with their continuations riding
        behind them when those fit too — while they fit the pass and the arena."""
        while ready and batch.fits(len(layout.labels[ready[0][1]]) - 1):
            doc, k = ready.popleft()
            batch.add(continuation(doc, k), (doc, k))
        while fresh:
            doc = fresh[0]
            key = (layout.preamble, doc.document)
            if doc.lent is None and state.kept(key):
                doc.lent = state.take(key)
            item = first_item(doc, keep_rest=False)
            if not batch.fits(len(item.tokens)):
                break
            riding = batch.fits(len(item.tokens) + continued) and doc.lent is None
            item = first_item(doc, keep_rest=bool(longer) and not riding)
            pages = sum(state.arena.pages_for(length) for _, length in item.keep if length > 0)
            if not state.memory.admit(pages, busy=bool(batch) or len(out) < len(rows) - len(fresh)):
                break
            fresh.popleft()
            batch.add(item, (doc, None))
            doc.riding = riding and bool(longer)
            if doc.riding:
                for k in longer:
                    batch.add(continuation(doc, k, item), (doc, k))

    def settle(tag: LabelTag, result: ItemResult, found: list[float]) -> None:
        doc, k = tag
        if k is None:
            doc.scores = found
            blocks = list(result.blocks)
            if doc.lent is None and layout.retain and doc.document:
                doc.lent = blocks.pop(0)
            doc.block = blocks[0] if blocks else None
            doc.waiting = len(longer)
            if not doc.riding:
                ready.extend((doc, j) for j in longer)
        else:
            doc.scores[k] += sum(found)
            doc.waiting -= 1
        if doc.waiting == 0:
            drop(state, doc.block)
            if layout.retain and doc.lent is not None:
                state.retain(alias, (layout.preamble, doc.document), doc.lent)
            else:
                drop(state, doc.lent)
            out[doc.row] = doc.scores

    finished: list[tuple[LabelTag, ItemResult]] = []

    def after_pass() -> None:
        for (tag, result), found in zip(finished, _read_pass(finished, layout, read), strict=True):
            settle(tag, result, found)
        finished.clear()
        state.report(len(out), len(rows))

    with state.reading(alias):
        run_passes(state, fill, lambda tag, result: finished.append((tag, result)), after_pass)
    return out


def _read_pass(finished: Sequence[tuple[LabelTag, ItemResult]], layout: LabelLayout,
               read: LabelReader) -> list[list[float]]:
    """Per finished item, what it reads: every label's first-token log-probability after a document, or
    the log-probabilities of a continued label's later tokens (one per read row), from `read` calls of at
    most READ_ROWS rows.

    Each read row asks for as many targets as there are labels; a continuation row's one target fills
    its row and only the first column of it is kept."""
    width = len(layout.labels)
    firsts = torch.tensor([label[0] for label in layout.labels], dtype=torch.long)
    hidden, targets = [], []
    for (_, k), result in finished:
        hidden.append(result.hidden)
        if k is None:
            targets.append(firsts[None, :])
        else:
            later = torch.tensor(layout.labels[k][1:], dtype=torch.long)
            targets.append(later[:, None].expand(-1, width))
    rows, wanted = torch.cat(hidden), torch.cat(targets)
    found = torch.cat([read(rows[i:i + READ_ROWS], wanted[i:i + READ_ROWS]).cpu()
                       for i in range(0, rows.shape[0], READ_ROWS)])
    out: list[list[float]] = []
    start = 0
    for (_, k), result in finished:
        read_rows = found[start:start + result.hidden.shape[0]]
        start += read_rows.shape[0]
        out.append(read_rows[0].tolist() if k is None else read_rows[:, 0].tolist())
    return out
