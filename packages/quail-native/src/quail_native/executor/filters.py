"""The filter scheduler: [document][frame][question 1] after the shared preamble, then question tails only.

Stage 1 computes a document and its frame and keeps their KV; a TRUE document asks its next
question tail only (KV rewind); a FALSE one frees its KV at once. Survivors' next stages are
admitted before fresh documents. With prefix sharing a document borrows the whole pages it shares
with a lender computed before it and computes only its tail.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from quail.planner.prefixes import plan_borrows
from quail_native.executor.packing import Item, ItemResult
from quail_native.executor.state import SharedState, Tokens, drop, run_passes


class FilterAnswer(NamedTuple):
    """One evaluated (document, stage)."""

    row: int
    stage: int
    """Index into the node's stages (not the predicate's written position)."""
    answer: bool
    margin: float


@dataclass(eq=False)
class FilterDocument:
    row: int
    tokens: Tokens
    stage: int = 0
    doc_block: int | None = None
    frame_block: int | None = None
    borrowed: int = 0
    view: int | None = None
    borrowers: list[FilterDocument] = field(default_factory=list)


@dataclass(frozen=True)
class FilterLayout:
    preamble: Tokens
    frame: Tokens
    questions: tuple[Tokens, ...]


def run_filter(state: SharedState, alias: str, rows: Sequence[int], documents: dict[int, Tokens],
               layout: FilterLayout, answer: Callable[[int, float], bool], margin_of: Callable[[ItemResult], float],
               retain: bool, share: bool = False) -> list[FilterAnswer]:
    """Every evaluated (document, stage), in the order they were answered."""
    if retain:
        state.release(alias)
    run = _FilterRun(state, alias, layout, answer, margin_of, retain)
    run.schedule(rows, documents, share)
    run_passes(state, run.next_items, run.done, run.after_pass)
    return run.out


@dataclass
class _FilterRun:
    """One filter node: documents move fresh → (lent a prefix) → in flight → stage by stage → done.

    Survivors' next stages are admitted first (they need no new pages), then documents whose lender
    has computed (their borrowed pages are pinned meanwhile), then fresh documents.
    """

    state: SharedState
    alias: str
    layout: FilterLayout
    answer: Callable[[int, float], bool]
    margin_of: Callable[[ItemResult], float]
    retain: bool
    out: list[FilterAnswer] = field(default_factory=list)
    fresh: deque[FilterDocument] = field(default_factory=deque)
    lent: deque[FilterDocument] = field(default_factory=deque)
    ready: deque[FilterDocument] = field(default_factory=deque)
    in_flight: int = 0
    finished: int = 0
    total: int = 0

    def schedule(self, rows: Sequence[int], documents: dict[int, Tokens], share: bool) -> None:
        self.pre = self.state.preamble(self.layout.preamble)
        self.total = len(rows)
        docs = {r: FilterDocument(r, documents[r]) for r in rows}
        if not share:
            self.fresh.extend(docs[r] for r in rows)
            return
        order, borrows = plan_borrows({r: d.tokens for r, d in docs.items()}, self.state.arena.page_tokens)
        for row in order:
            borrow = borrows.get(row)
            if borrow is None:
                self.fresh.append(docs[row])
            else:
                docs[row].borrowed = borrow.tokens
                docs[borrow.lender].borrowers.append(docs[row])

    @property
    def keeps_frame(self) -> bool:
        return len(self.layout.questions) > 1

    def keeps_document(self, doc: FilterDocument) -> bool:
        return self.keeps_frame or self.retain or bool(doc.borrowers)

    def first_item(self, doc: FilterDocument) -> Item:
        skip = doc.borrowed if doc.view is not None else 0
        body = doc.tokens[skip:]
        frame, question = self.layout.frame, self.layout.questions[0]
        spans = ((0, len(body)),) if self.keeps_document(doc) else ()
        spans += ((len(body), len(frame)),) if self.keeps_frame else ()
        parents = (self.pre,) + ((doc.view,) if doc.view is not None else ())
        tokens = body + frame + question
        return Item(tokens, len(self.layout.preamble) + skip, parents, (len(tokens) - 1,), spans)

    def next_item(self, doc: FilterDocument) -> Item:
        parents = (self.pre, doc.doc_block) + ((doc.frame_block,) if doc.frame_block is not None else ())
        question = self.layout.questions[doc.stage]
        start = len(self.layout.preamble) + len(doc.tokens) + len(self.layout.frame)
        return Item(question, start, tuple(p for p in parents if p is not None), (len(question) - 1,))

    def pages(self, doc: FilterDocument, item: Item) -> int:
        """Pages the first item of `doc` takes: its kept spans, plus the part-page its borrowed prefix's
        continuation copies (see `KVArena.concat`)."""
        arena = self.state.arena
        kept = sum(arena.pages_for(length) for _, length in item.keep if length > 0)
        continued = doc.view is not None and self.keeps_document(doc)
        return kept + (arena.continuation_pages(doc.borrowed, len(doc.tokens) - doc.borrowed) if continued else 0)

    def next_items(self, budget: int) -> list[tuple[Item, FilterDocument]]:
        batch: list[tuple[Item, FilterDocument]] = []
        used = 0
        while self.ready and used + len(self.next_item(self.ready[0]).tokens) <= budget:
            doc = self.ready.popleft()
            batch.append((self.next_item(doc), doc))
            used += len(batch[-1][0].tokens)
        for queue in (self.lent, self.fresh):
            while queue:
                doc = queue[0]
                self.protect(doc)
                item = self.first_item(doc)
                if used + len(item.tokens) > budget or \
                        not self.state.memory.admit(self.pages(doc, item), busy=self.in_flight > 0 or bool(batch)):
                    self.expose(doc)
                    return batch
                queue.popleft()
                batch.append((item, doc))
                used += len(item.tokens)
                self.in_flight += 1
        return batch

    def done(self, doc: FilterDocument, result: ItemResult) -> None:
        if doc.stage == 0:
            self.first_done(doc, result)
        margin = self.margin_of(result)
        verdict = self.answer(doc.stage, margin)
        self.out.append(FilterAnswer(doc.row, doc.stage, verdict, margin))
        if verdict and doc.stage < len(self.layout.questions) - 1:
            doc.stage += 1
            self.ready.append(doc)
            return
        self.in_flight -= 1
        self.finished += 1
        drop(self.state, doc.frame_block)
        if verdict and self.retain and doc.doc_block is not None:
            self.state.retain(self.alias, (self.layout.preamble, doc.tokens), doc.doc_block)
        else:
            drop(self.state, doc.doc_block)

    def first_done(self, doc: FilterDocument, result: ItemResult) -> None:
        blocks = list(result.blocks)
        if self.keeps_document(doc):
            doc.doc_block = blocks.pop(0)
        if self.keeps_frame:
            doc.frame_block = blocks.pop(0)
        if doc.view is not None:
            arena = self.state.arena
            doc.doc_block = arena.concat(doc.view, doc.doc_block) if doc.doc_block is not None else None
            if doc.doc_block is None:
                arena.free(doc.view)
            doc.view = None
        for borrower in doc.borrowers:
            self.lend(doc, borrower)
        doc.borrowers.clear()

    def lend(self, lender: FilterDocument, borrower: FilterDocument) -> None:
        """Pin the lender's first pages for the borrower until it is admitted (evictable meanwhile)."""
        assert lender.doc_block is not None
        borrower.view = self.state.arena.view(lender.doc_block, borrower.borrowed)
        self.expose(borrower)
        self.lent.append(borrower)

    def expose(self, doc: FilterDocument) -> None:
        """Let admission evict a waiting borrower's pages; it then computes its whole document."""
        if doc.view is None:
            return

        def lost() -> None:
            self.state.counters.recomputed_tokens += doc.borrowed
            doc.view = None

        self.state.memory.keep(doc.view, 1.0, lost)

    def protect(self, doc: FilterDocument) -> None:
        if doc.view is not None:
            self.state.memory.unkeep(doc.view)

    def after_pass(self) -> None:
        self.state.report(self.finished, self.total)
