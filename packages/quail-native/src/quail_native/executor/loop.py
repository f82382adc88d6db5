"""The schedulers: how each model node's work becomes packed passes.

* filters — stage 1 computes [document][frame][question 1] after the shared preamble and keeps the
  document and frame KV; a TRUE document asks its next question tail only (KV rewind); a FALSE one
  frees its KV at once. Survivors' next stages are admitted before fresh documents.
* joins — each anchor's [document][frame] is computed once (or its document KV is reused from its
  filter), then every candidate's [labels + partner documents + cue] is packed as a sibling that
  attends to the anchor; an anchor's KV is freed once its partners are answered (exists / anti stop
  at the first TRUE).
* classify / score — [document][tail] per row; labels longer than one token continue from it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from quail_native.executor.arena import KVArena
from quail_native.executor.packing import Item, ItemResult, Packer

Tag = TypeVar("Tag")
Tokens = tuple[int, ...]
DocKey = tuple[Tokens, Tokens]
"""(preamble, document tokens): the KV of a document prefix depends on nothing else."""


@dataclass
class Budget:
    """Tokens per forward pass, and KV tokens the arena may hold for work in flight."""

    pass_tokens: int
    kv_tokens: int


@dataclass
class SharedState:
    """What outlives one node: the arena, preamble blocks, and documents' KV kept for later nodes."""

    packer: Packer
    budget: Budget
    preambles: dict[Tokens, int] = field(default_factory=dict)
    retained: dict[DocKey, int] = field(default_factory=dict)
    retained_by: dict[str, set[DocKey]] = field(default_factory=dict)
    kv_hits: int = 0
    kv_misses: int = 0
    progress: Callable[[int, int], None] | None = None

    def report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)

    @property
    def arena(self) -> KVArena:
        return self.packer.arena

    def preamble(self, tokens: Tokens) -> int:
        """The block of a preamble, computed once and shared by every document after it."""
        block = self.preambles.get(tokens)
        if block is None or block not in self.arena:
            [result] = self.packer.run([Item(tokens, 0, keep=((0, len(tokens)),))])
            block = result.blocks[0]
            self.preambles[tokens] = block
        return block

    def fits(self, extra: int, in_flight: int) -> bool:
        """Admission: room in the KV budget, or nothing else in flight (so it can never deadlock)."""
        return in_flight == 0 or self.arena.tokens_held + extra <= self.budget.kv_tokens

    def retain(self, alias: str, key: DocKey, block: int) -> None:
        """Keep a filter survivor's document KV for the join anchored on `alias`."""
        earlier = self.retained.get(key)
        if earlier is not None and earlier != block:
            self.arena.free(block)
            return
        self.retained[key] = block
        self.retained_by.setdefault(alias, set()).add(key)

    def release(self, alias: str) -> None:
        """Free whatever was kept for `alias` and not consumed: its anchoring join has finished."""
        for key in self.retained_by.pop(alias, set()):
            block = self.retained.pop(key, None)
            if block is not None:
                self.arena.free(block)

    def consume(self, key: DocKey) -> None:
        block = self.retained.pop(key, None)
        if block is not None:
            self.arena.free(block)


def run_passes(packer: Packer, budget: int, next_items: Callable[[int], list[tuple[Item, Tag]]],
               done: Callable[[Tag, ItemResult], None], after_pass: Callable[[], None] = lambda: None) -> None:
    """Keep asking for items that fit `budget` tokens and running them until none come."""
    while True:
        batch = next_items(budget)
        if not batch:
            return
        results = packer.run([item for item, _ in batch])
        for (_, tag), result in zip(batch, results, strict=True):
            done(tag, result)
        after_pass()


@dataclass
class FilterDocument:
    row: int
    tokens: Tokens
    stage: int = 0
    doc_block: int | None = None
    frame_block: int | None = None


def run_filter(state: SharedState, alias: str, rows: Sequence[int], documents: dict[int, Tokens],
               preamble: Tokens, frame: Tokens, questions: Sequence[Tokens],
               answer: Callable[[int, float], bool], margin_of: Callable[[ItemResult], float],
               retain: bool) -> list[tuple[int, int, bool, float]]:
    """(row, stage index, answer, margin) for every evaluated (document, stage)."""
    pre = state.preamble(preamble)
    start = len(preamble)
    if retain:
        state.release(alias)
    fresh = deque(FilterDocument(r, documents[r]) for r in rows)
    ready: deque[FilterDocument] = deque()
    out: list[tuple[int, int, bool, float]] = []
    in_flight = [0]
    last = len(questions) - 1
    keep_blocks = last > 0 or retain

    def item_for(doc: FilterDocument) -> Item:
        if doc.stage == 0:
            spans = ((0, len(doc.tokens)), (len(doc.tokens), len(frame))) if keep_blocks else ()
            tokens = doc.tokens + frame + questions[0]
            return Item(tokens, start, (pre,), (len(tokens) - 1,), spans)
        parents = (pre, doc.doc_block) + ((doc.frame_block,) if doc.frame_block is not None else ())
        question = questions[doc.stage]
        return Item(question, start + len(doc.tokens) + len(frame), parents, (len(question) - 1,))

    def next_items(budget: int) -> list[tuple[Item, FilterDocument]]:
        batch: list[tuple[Item, FilterDocument]] = []
        used = 0
        while ready and used + len(item_for(ready[0]).tokens) <= budget:
            doc = ready.popleft()
            item = item_for(doc)
            batch.append((item, doc))
            used += len(item.tokens)
        while fresh:
            doc = fresh[0]
            size = len(doc.tokens) + len(frame) + len(questions[0])
            if used + size > budget or not state.fits(len(doc.tokens) + len(frame), in_flight[0] + len(batch)):
                break
            fresh.popleft()
            batch.append((item_for(doc), doc))
            used += size
        return batch

    def done(doc: FilterDocument, result: ItemResult) -> None:
        if doc.stage == 0:
            in_flight[0] += 1
            if result.blocks:
                doc.doc_block = result.blocks[0]
                doc.frame_block = result.blocks[1] if len(result.blocks) > 1 else None
        margin = margin_of(result)
        verdict = answer(doc.stage, margin)
        out.append((doc.row, doc.stage, verdict, margin))
        if verdict and doc.stage < last:
            doc.stage += 1
            ready.append(doc)
            return
        in_flight[0] -= 1
        _drop(state, doc.frame_block)
        if verdict and retain and doc.doc_block is not None:
            state.retain(alias, (preamble, doc.tokens), doc.doc_block)
        else:
            _drop(state, doc.doc_block)

    def after_pass() -> None:
        state.report(len(rows) - len(fresh) - in_flight[0], len(rows))

    run_passes(state.packer, state.budget.pass_tokens, next_items, done, after_pass)
    return out


def _drop(state: SharedState, block: int | None) -> None:
    if block is not None:
        state.arena.free(block)


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
    started: bool = False


JoinTag = tuple[Anchor, tuple[int, ...] | None]
"""An anchor's prefix item (rows None) or one candidate tuple's suffix item."""


def run_join(state: SharedState, anchors: list[Anchor], preamble: Tokens, frame: Tokens, stop_at_true: bool,
             margin_of: Callable[[ItemResult], float], answer: Callable[[float], bool], retain: bool = False
             ) -> list[tuple[tuple[int, ...], bool, float]]:
    """(tuple of rows, answer, margin) per evaluated candidate, anchor by anchor.

    `retain` keeps each anchor's document KV for a later join anchored on the same alias.
    """
    pre = state.preamble(preamble)
    start = len(preamble)
    waiting = deque(anchors)
    active: list[Anchor] = []
    out: list[tuple[tuple[int, ...], bool, float]] = []

    def prefix_item(anchor: Anchor) -> Item:
        reused = state.retained.get((preamble, anchor.tokens))
        if reused is not None:
            state.kv_hits += 1
            anchor.doc_block = reused
            return Item(frame, start + len(anchor.tokens), (pre, reused), (), ((0, len(frame)),))
        state.kv_misses += 1
        return Item(anchor.tokens + frame, start, (pre,), (), ((0, len(anchor.tokens)), (len(anchor.tokens),
                                                                                        len(frame))))

    def suffix_item(anchor: Anchor, suffix: Tokens) -> Item:
        parents = (pre, anchor.doc_block, anchor.frame_block)
        return Item(suffix, start + len(anchor.tokens) + len(frame), tuple(p for p in parents if p is not None),
                    (len(suffix) - 1,))

    def next_items(budget: int) -> list[tuple[Item, JoinTag]]:
        batch: list[tuple[Item, JoinTag]] = []
        used = 0
        for anchor in active:
            share = max(1, len(anchor.pending) // 4) if stop_at_true else len(anchor.pending)
            while anchor.pending and share and used + len(anchor.pending[0][1]) <= budget:
                rows, suffix = anchor.pending.popleft()
                batch.append((suffix_item(anchor, suffix), (anchor, rows)))
                anchor.outstanding += 1
                used += len(suffix)
                share -= 1
        while waiting:
            anchor = waiting[0]
            size = len(frame) + (0 if (preamble, anchor.tokens) in state.retained else len(anchor.tokens))
            if used + size > budget or not state.fits(size, len(active)):
                break
            waiting.popleft()
            anchor.started = True
            batch.append((prefix_item(anchor), (anchor, None)))
            used += size
        return batch

    def done(tag: JoinTag, result: ItemResult) -> None:
        anchor, rows = tag
        if rows is None:
            if anchor.doc_block is None:
                anchor.doc_block, anchor.frame_block = result.blocks
            else:
                anchor.frame_block = result.blocks[0]
            active.append(anchor)
        else:
            anchor.outstanding -= 1
            margin = margin_of(result)
            verdict = answer(margin)
            out.append((rows, verdict, margin))
            anchor.answered_true = anchor.answered_true or verdict
            if stop_at_true and verdict:
                anchor.pending.clear()
        if not anchor.pending and anchor.outstanding == 0 and anchor in active:
            active.remove(anchor)
            _drop(state, anchor.frame_block)
            _finish_anchor(state, anchor, (preamble, anchor.tokens), retain)

    total = sum(len(a.pending) for a in anchors)
    run_passes(state.packer, state.budget.pass_tokens, next_items, done, lambda: state.report(len(out), total))
    if anchors and not retain:
        state.release(anchors[0].alias)
    return out


def _finish_anchor(state: SharedState, anchor: Anchor, key: DocKey, retain: bool) -> None:
    """Keep the anchor's document KV for the next join on its alias, or free it."""
    kept = state.retained.get(key) == anchor.doc_block
    if retain and anchor.doc_block is not None:
        if not kept:
            state.retain(anchor.alias, key, anchor.doc_block)
    elif kept:
        state.consume(key)
    else:
        _drop(state, anchor.doc_block)
