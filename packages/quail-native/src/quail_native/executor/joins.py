"""The join scheduler: each anchor's [document][frame] once, every candidate's suffix as a sibling.

An anchor's prefix is computed once (or its document KV is taken from its filter); then every
candidate tuple's [labels + partner documents + cue] is packed as a sibling that attends to the
anchor but not to other siblings — from the pass that computes the anchor's prefix on, reading its
rows there (`Item.lender`) before its KV is kept. An anchor's KV is freed once its partners are answered (exists /
anti stop at the first TRUE), or kept for the next join anchored on the same alias. With prefix
sharing an anchor borrows the prefix it shares with an anchor computed before it (`lending.py`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from quail_native.executor.lending import Lending, Loan
from quail_native.executor.packing import Item, ItemResult
from quail_native.executor.state import Batch, Lead, SharedState, Tokens, drop, run_passes


class JoinAnswer(NamedTuple):
    """One evaluated candidate tuple (rows in the predicate's alias order)."""

    rows: tuple[int, ...]
    answer: bool
    margin: float


@dataclass
class Anchor:
    alias: str
    row: int
    tokens: Tokens
    pending: deque[tuple[tuple[int, ...], Tokens]]
    doc_block: int | None = None
    frame_block: int | None = None
    answered_true: bool = False
    outstanding: int = 0
    looked_up: bool = False
    loan: Loan = field(default_factory=Loan)


JoinTag = tuple[Anchor, tuple[int, ...] | None]
"""An anchor's prefix item (rows None) or one candidate tuple's suffix item."""


@dataclass(frozen=True)
class JoinLayout:
    preamble: Tokens
    frame: Tokens
    semantics: str  # "full", "exists" or "anti"


def run_join(state: SharedState, anchors: list[Anchor], layout: JoinLayout,
             margin_of: Callable[[ItemResult], float], answer: Callable[[float], bool], retain: bool = False,
             share: bool = False, lead: Lead | None = None) -> list[JoinAnswer]:
    """Every evaluated candidate, anchor by anchor; the `lead` items (calibration) ride in the first pass.

    `retain` keeps the document KV of each anchor that reaches the next join anchored on the same
    alias (one with a TRUE answer, or none under anti semantics); `share` lets anchors borrow the
    prefixes they share.
    """
    preamble, frame = layout.preamble, layout.frame
    stop_at_true = layout.semantics != "full"
    pre = state.preamble(preamble)
    start = len(preamble)
    lending: Lending[Anchor] = Lending(state)
    waiting = deque(lending.plan({a.row: a for a in anchors}) if share else anchors)
    active: list[Anchor] = []
    out: list[JoinAnswer] = []

    def prefix_item(anchor: Anchor) -> Item:
        if anchor.doc_block is not None:
            return Item(frame, start + len(anchor.tokens), (pre, anchor.doc_block), (), ((0, len(frame)),))
        skip = lending.skipped(anchor)
        body = anchor.tokens[skip:]
        return Item(body + frame, start + skip, (pre, *lending.parents(anchor)), (),
                    ((0, len(body)), (len(body), len(frame))) if body else ((0, len(frame)),),
                    *lending.in_pass(anchor))

    def pages(anchor: Anchor, item: Item) -> int:
        kept = sum(state.arena.pages_for(length) for _, length in item.keep)
        return kept + (lending.continuation_pages(anchor) if anchor.doc_block is None else 0)

    def suffix_item(anchor: Anchor, suffix: Tokens, prefix: Item | None) -> Item:
        """A candidate's suffix after its anchor's kept document and frame, or — with `prefix`, the anchor's
        item computing them in the same pass — after that item's rows."""
        begin = start + len(anchor.tokens) + len(frame)
        if prefix is not None:
            return Item(suffix, begin, prefix.parents, (len(suffix) - 1,), (), prefix, len(prefix.tokens))
        parents = (pre, anchor.doc_block, anchor.frame_block)
        return Item(suffix, begin, tuple(p for p in parents if p is not None), (len(suffix) - 1,))

    def admit_suffixes(anchor: Anchor, batch: Batch[JoinTag], prefix: Item | None = None) -> None:
        """The anchor's next candidates that fit (a quarter of them a pass when the first TRUE ends the
        anchor), in the pass of its `prefix` item when given."""
        share = max(1, len(anchor.pending) // 4) if stop_at_true else len(anchor.pending)
        while anchor.pending and share and batch.fits(len(anchor.pending[0][1])):
            rows, suffix = anchor.pending.popleft()
            batch.add(suffix_item(anchor, suffix, prefix), (anchor, rows))
            anchor.outstanding += 1
            share -= 1

    def kept_by_a_filter(anchor: Anchor) -> bool:
        """Looks up (once) the document KV a filter kept for this anchor."""
        if not anchor.looked_up:
            anchor.doc_block = state.take((preamble, anchor.tokens))
            anchor.looked_up = True
        return anchor.doc_block is not None

    def fill(batch: Batch[JoinTag]) -> None:
        """Active anchors' next candidates, then anchors whose views are ready, then fresh anchors (each with
        its first candidates and the borrowers that ride in its pass), while they fit the pass and the arena."""
        for anchor in active:
            admit_suffixes(anchor, batch)
        for queue in (lending.lent, waiting):
            while queue:
                anchor = queue[0]
                if not anchor.looked_up and kept_by_a_filter(anchor):
                    lending.cancel(anchor)  # its whole document is there: it needs no loan
                lending.protect(anchor)
                item = admit(batch, anchor, busy=bool(active) or bool(batch))
                if item is None:
                    lending.expose(anchor)
                    return
                queue.popleft()
                lending.admit_riders(anchor, item, lambda rider, lender=anchor: admit_rider(batch, lender, rider))

    def admit(batch: Batch[JoinTag], anchor: Anchor, busy: bool) -> Item | None:
        """The anchor's prefix item and the first candidates behind it, put in the pass when the prefix fits
        and the arena has its pages."""
        item = prefix_item(anchor)
        if not batch.fits(len(item.tokens)) or not state.memory.admit(pages(anchor, item), busy=busy):
            return None
        batch.add(item, (anchor, None))
        admit_suffixes(anchor, batch, item)
        return item

    def admit_rider(batch: Batch[JoinTag], lender: Anchor, rider: Anchor) -> bool:
        """A rider of `lender` whose whole document a filter kept needs no loan: it waits as an anchor with its
        document (and the round goes on); any other is admitted when it fits."""
        if kept_by_a_filter(rider):
            lending.release(lender, rider)
            waiting.appendleft(rider)
            return True
        return admit(batch, rider, busy=True) is not None

    def done(tag: JoinTag, result: ItemResult) -> None:
        anchor, rows = tag
        if rows is None:
            if anchor.doc_block is None:
                *document, anchor.frame_block = result.blocks  # no document block when it borrowed all of it
                anchor.doc_block = lending.continued(anchor, document[0] if document else None, keep=True)
            else:
                anchor.frame_block = result.blocks[0]
            if anchor.loan.borrowers:
                assert anchor.doc_block is not None
                lending.lend(anchor, anchor.doc_block)
            active.append(anchor)
        else:
            anchor.outstanding -= 1
            margin = margin_of(result)
            verdict = answer(margin)
            out.append(JoinAnswer(rows, verdict, margin))
            anchor.answered_true = anchor.answered_true or verdict
            if stop_at_true and verdict:
                anchor.pending.clear()
        if not anchor.pending and anchor.outstanding == 0 and anchor in active:
            active.remove(anchor)
            drop(state, anchor.frame_block)
            survives = anchor.answered_true != (layout.semantics == "anti")
            if retain and survives and anchor.doc_block is not None:
                state.retain(anchor.alias, (preamble, anchor.tokens), anchor.doc_block)
            else:
                drop(state, anchor.doc_block)

    total = sum(len(a.pending) for a in anchors)
    run_passes(state, fill, done, lambda: state.report(len(out), total), lead)
    if anchors and not retain:
        state.release(anchors[0].alias)
    return out
