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
from quail_native.executor.state import Batch, DocKey, Lead, SharedState, Tokens, drop, run_passes


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
    kept: bool = False
    """An earlier node kept its document's KV (`SharedState.retain`): it takes no part in prefix sharing."""
    lent: bool = False
    """It took that KV (`doc_block`) when admitted: its first item computes the frame and question only."""


@dataclass(frozen=True)
class FilterLayout:
    preamble: Tokens
    frame: Tokens
    questions: tuple[Tokens, ...]


def run_filter(state: SharedState, alias: str, rows: Sequence[int], documents: dict[int, Tokens],
               layout: FilterLayout, answer: Callable[[int, float], bool], margin_of: Callable[[ItemResult], float],
               retain: bool, share: bool = False, lead: Lead | None = None,
               retain_all: bool = False) -> list[FilterAnswer]:
    """Every evaluated (document, stage), in the order they were answered; the `lead` items (calibration)
    ride in the first pass, ahead of the documents. A document whose KV an earlier node kept computes only its
    frame and question over it; with `retain` each surviving document's KV is kept for a later node (every
    document's with `retain_all`: a value every row goes on with), and what earlier nodes kept for `alias` and
    this one did not read is freed at the end."""
    run = _FilterRun(state, alias, layout, answer, margin_of, retain or retain_all, retain_all)
    with state.reading(alias):
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
    retain_all: bool = False
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
        for doc in docs.values():
            doc.kept = self.state.kept(self.key(doc))
        kept = [docs[r] for r in rows if docs[r].kept]  # first: they need no pages for their documents
        rest = {r: doc for r, doc in docs.items() if not doc.kept}
        self.fresh.extend([*kept, *(self.lending.plan(rest) if share else (rest[r] for r in rows if r in rest))])

    def key(self, doc: FilterDocument) -> DocKey:
        return (self.layout.preamble, doc.tokens)

    def take(self, doc: FilterDocument) -> None:
        """An admitted document whose KV an earlier node kept reads it (once looked up, never again)."""
        if doc.kept and not doc.lent:
            doc.kept = False
            doc.doc_block = self.state.take(self.key(doc))
            doc.lent = doc.doc_block is not None

    @property
    def keeps_frame(self) -> bool:
        return len(self.layout.questions) > 1

    def keeps_document(self, doc: FilterDocument) -> bool:
        return self.keeps_frame or self.retain or bool(doc.loan.borrowers)

    def first_item(self, doc: FilterDocument) -> Item:
        if doc.lent:
            assert doc.doc_block is not None
            tokens = self.layout.frame + self.layout.questions[0]
            spans = ((0, len(self.layout.frame)),) if self.keeps_frame else ()
            return Item(tokens, len(self.layout.preamble) + len(doc.tokens), (self.pre, doc.doc_block),
                        (len(tokens) - 1,), spans)
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
        self.take(doc)
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
        if (verdict or self.retain_all) and self.retain and doc.doc_block is not None:
            self.state.retain(self.alias, self.key(doc), doc.doc_block)
        else:
            drop(self.state, doc.doc_block)

    def first_done(self, doc: FilterDocument, result: ItemResult) -> None:
        blocks = list(result.blocks)
        if doc.lent:  # its document's KV was there already
            if self.keeps_frame:
                doc.frame_block = blocks.pop(0)
            return
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
