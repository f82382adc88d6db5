"""The filter scheduler: [document][frame][question 1] after the shared preamble, then question tails only.

Stage 1 computes a document and its frame and keeps their KV; a TRUE document asks its next
question tail only (KV rewind); a FALSE one frees its KV at once. Survivors' next stages are
admitted before fresh documents. With prefix sharing a document borrows the prefix it shares with
a lender computed before it and computes only its tail (`lending.py`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from quail_native.executor.lending import Lending, Loan
from quail_native.executor.packing import Item, ItemResult
from quail_native.executor.state import Batch, Lead, SharedState, Tokens, drop, run_passes


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
    loan: Loan = field(default_factory=Loan)


@dataclass(frozen=True)
class FilterLayout:
    preamble: Tokens
    frame: Tokens
    questions: tuple[Tokens, ...]


def run_filter(state: SharedState, alias: str, rows: Sequence[int], documents: dict[int, Tokens],
               layout: FilterLayout, answer: Callable[[int, float], bool], margin_of: Callable[[ItemResult], float],
               retain: bool, share: bool = False, lead: Lead | None = None) -> list[FilterAnswer]:
    """Every evaluated (document, stage), in the order they were answered; the `lead` items (calibration)
    ride in the first pass, ahead of the documents."""
    if retain:
        state.release(alias)
    run = _FilterRun(state, alias, layout, answer, margin_of, retain)
    run.schedule(rows, documents, share)
    run_passes(state, run.fill, run.done, run.after_pass, lead)
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
    ready: deque[FilterDocument] = field(default_factory=deque)
    in_flight: int = 0
    finished: int = 0
    total: int = 0

    def schedule(self, rows: Sequence[int], documents: dict[int, Tokens], share: bool) -> None:
        self.pre = self.state.preamble(self.layout.preamble)
        self.total = len(rows)
        self.lending: Lending[FilterDocument] = Lending(self.state)
        docs = {r: FilterDocument(r, documents[r]) for r in rows}
        self.fresh.extend(self.lending.plan(docs) if share else (docs[r] for r in rows))

    @property
    def keeps_frame(self) -> bool:
        return len(self.layout.questions) > 1

    def keeps_document(self, doc: FilterDocument) -> bool:
        return self.keeps_frame or self.retain or bool(doc.loan.borrowers)

    def first_item(self, doc: FilterDocument) -> Item:
        skip = self.lending.skipped(doc)
        body = doc.tokens[skip:]
        frame, question = self.layout.frame, self.layout.questions[0]
        spans = ((0, len(body)),) if self.keeps_document(doc) and body else ()
        spans += ((len(body), len(frame)),) if self.keeps_frame else ()
        parents = (self.pre, *self.lending.parents(doc))
        tokens = body + frame + question
        return Item(tokens, len(self.layout.preamble) + skip, parents, (len(tokens) - 1,), spans,
                    *self.lending.in_pass(doc))

    def next_item(self, doc: FilterDocument) -> Item:
        parents = (self.pre, doc.doc_block) + ((doc.frame_block,) if doc.frame_block is not None else ())
        question = self.layout.questions[doc.stage]
        start = len(self.layout.preamble) + len(doc.tokens) + len(self.layout.frame)
        return Item(question, start, tuple(p for p in parents if p is not None), (len(question) - 1,))

    def pages(self, doc: FilterDocument, item: Item) -> int:
        """Pages the first item of `doc` takes: its kept spans, plus the part-page its borrowed prefix's
        continuation copies (see `KVArena.concat`)."""
        kept = sum(self.state.arena.pages_for(length) for _, length in item.keep if length > 0)
        return kept + (self.lending.continuation_pages(doc) if self.keeps_document(doc) else 0)

    def fill(self, batch: Batch[FilterDocument]) -> None:
        """Survivors' next questions, then borrowers whose views are ready, then fresh documents (each with
        the borrowers that ride in its pass), while they fit the pass and the arena."""
        while self.ready and batch.fits(len(self.next_item(self.ready[0]).tokens)):
            doc = self.ready.popleft()
            batch.add(self.next_item(doc), doc)
        for queue in (self.lending.lent, self.fresh):
            while queue:
                doc = queue[0]
                self.lending.protect(doc)
                item = self.admit(batch, doc, busy=self.in_flight > 0 or bool(batch))
                if item is None:
                    self.lending.expose(doc)
                    return
                queue.popleft()
                self.lending.admit_riders(doc, item, lambda rider: self.admit(batch, rider, busy=True) is not None)

    def admit(self, batch: Batch[FilterDocument], doc: FilterDocument, busy: bool) -> Item | None:
        """The document's first item, put in the pass when its tokens fit and the arena has its pages."""
        item = self.first_item(doc)
        if not batch.fits(len(item.tokens)) or not self.state.memory.admit(self.pages(doc, item), busy=busy):
            return None
        batch.add(item, doc)
        self.in_flight += 1
        return item

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
        keep = self.keeps_document(doc)
        if keep and self.lending.computes_body(doc):
            doc.doc_block = blocks.pop(0)
        if self.keeps_frame:
            doc.frame_block = blocks.pop(0)
        doc.doc_block = self.lending.continued(doc, doc.doc_block, keep)
        if doc.loan.borrowers:
            assert doc.doc_block is not None  # a lender always keeps its document
            self.lending.lend(doc, doc.doc_block)

    def after_pass(self) -> None:
        self.state.report(self.finished, self.total)
