"""The generation scheduler: batched greedy decoding over the paged KV arena.

A sequence starts as one item — [document][tail] after the shared preamble — whose KV is kept; its first
token is read at the tail's last position. Each later step is one item of one token (the token just chosen)
over the sequence's KV, kept and appended to it (`KVArena.concat`: whole pages are shared, only the
part-page is copied). Every pass carries the next token of every sequence in flight, then as many new
documents as fit: sequences join and leave the batch at any step, so the weights read once per pass serve
as many sequences as the pass holds. A sequence ends before its first stop token or at the token bound; its
last token is never fed back (nothing would read it).

Room is promised on admission: a document is admitted only while the arena can still hold every admitted
sequence grown to its bound, so a step never waits on pages another sequence holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from quail.extend import Finish
from quail_native.executor.grammar import Constraint
from quail_native.executor.packing import Item, ItemResult
from quail_native.executor.state import Batch, SharedState, Tokens, drop, run_passes

Chooser = Callable[[torch.Tensor, torch.Tensor | None], list[int]]
"""The next token of each hidden row [rows, hidden], among the allowed ones ([rows, vocabulary] bool, None: all):
the argmax of the head (`readout.greedy_tokens`)."""


@dataclass(frozen=True)
class GenerationLayout:
    preamble: Tokens
    tail: Tokens
    max_tokens: int
    stop: frozenset[int]
    retain: bool = False
    """Keep each document's KV (after the preamble) for a later node over the same documents."""


@dataclass(frozen=True)
class Generated:
    row: int
    tokens: tuple[int, ...]
    finish: Finish
    """`stop` when the model wrote a stop token, `length` at the token bound."""


@dataclass(eq=False)
class _Sequence:
    row: int
    document: Tokens
    prompt: Tokens
    block: int | None = None
    length: int = 0
    """Tokens whose KV `block` holds (the preamble's excluded)."""
    out: list[int] = field(default_factory=list)
    promised: int = 0
    """Pages still promised to it: what growing to the bound may take beyond what it holds."""
    lent: int | None = None
    """The document's KV kept by an earlier node (`SharedState.take`): only the tail is computed over it."""
    constraint: Constraint | None = None
    """Its place in the grammar of a structured generation."""


def run_generation(state: SharedState, alias: str, rows: Sequence[int], documents: dict[int, Tokens],
                   layout: GenerationLayout, choose: Chooser,
                   constrain: Callable[[], Constraint] | None = None) -> list[Generated]:
    """Every row's generation, in the order they finished; `constrain` gives each sequence its grammar matcher.
    A document whose KV an earlier node kept (a filter's survivor, an earlier generation's document) computes only
    its tail; with `layout.retain` each document's KV is kept for a later node."""
    run = _GenerationRun(state, alias, layout, choose, constrain)
    run.fresh.extend(_Sequence(r, documents[r], documents[r] + layout.tail) for r in rows)
    run.total = len(rows)
    run_passes(state, run.fill, run.done, run.after_pass)
    return run.out


@dataclass
class _GenerationRun:
    state: SharedState
    alias: str
    layout: GenerationLayout
    choose: Chooser
    constrain: Callable[[], Constraint] | None
    """A new sequence's grammar matcher, made when it is admitted (None: free text)."""
    fresh: deque[_Sequence] = field(default_factory=deque)
    stepping: list[_Sequence] = field(default_factory=list)
    """Sequences with a token chosen and not yet fed back."""
    finished_pass: list[tuple[_Sequence, ItemResult]] = field(default_factory=list)
    out: list[Generated] = field(default_factory=list)
    promised: int = 0
    total: int = 0

    def __post_init__(self) -> None:
        self.pre = self.state.preamble(self.layout.preamble)

    @property
    def start(self) -> int:
        return len(self.layout.preamble)

    def growth(self, sequence: _Sequence) -> int:
        """Pages a sequence may still take: its bound's pages beyond its prompt's, and one part-page copy."""
        arena = self.state.arena
        whole = arena.pages_for(len(sequence.prompt) + self.layout.max_tokens)
        return whole - arena.pages_for(len(sequence.prompt)) + 1

    def fill(self, batch: Batch[_Sequence]) -> None:
        """The next token of every sequence in flight, then new documents while the pass and the arena hold them."""
        stepping, self.stepping = self.stepping, []
        for sequence in stepping:
            if not batch.fits(1):
                self.stepping.append(sequence)
                continue
            assert sequence.block is not None
            self.state.memory.admit(2, busy=True)
            batch.add(Item((sequence.out[-1],), self.start + sequence.length, (self.pre, sequence.block), (0,),
                           ((0, 1),)), sequence)
        while self.fresh and batch.fits(len(self.fresh[0].prompt)):
            sequence = self.fresh[0]
            arena = self.state.arena
            pages = arena.pages_for(len(sequence.prompt))
            growth = self.growth(sequence)
            busy = bool(batch) or self.promised > 0
            if arena.free_pages - self.promised < pages + growth and busy:
                return
            if not self.state.memory.admit(pages + growth, busy=busy):
                return
            self.fresh.popleft()
            sequence.promised = growth
            self.promised += growth
            batch.add(self.first_item(sequence), sequence)

    def first_item(self, sequence: _Sequence) -> Item:
        """[document][tail] after the preamble — or the tail alone over the document's kept KV — with the KV kept
        (the document's apart when it is kept for a later node)."""
        sequence.lent = self.state.take((self.layout.preamble, sequence.document))
        sequence.constraint = self.constrain() if self.constrain is not None else None
        tail = self.layout.tail
        if sequence.lent is not None:
            return Item(tail, self.start + len(sequence.document), (self.pre, sequence.lent), (len(tail) - 1,),
                        ((0, len(tail)),))
        document = len(sequence.document)
        spans = ((0, document), (document, len(tail))) if self.layout.retain and document else ((0, len(tail) +
                                                                                                   document),)
        return Item(sequence.prompt, self.start, (self.pre,), (len(sequence.prompt) - 1,), spans)

    def done(self, sequence: _Sequence, result: ItemResult) -> None:
        self.finished_pass.append((sequence, result))

    def after_pass(self) -> None:
        """Choose every sequence's next token from its pass's rows at once (one head GEMM), then keep or end it."""
        finished, self.finished_pass = self.finished_pass, []
        if not finished:
            return
        chosen = self.choose(torch.cat([result.hidden for _, result in finished]), _allowed(finished))
        for (sequence, result), token in zip(finished, chosen, strict=True):
            self._grow(sequence, result)
            if token in self.layout.stop:
                self._end(sequence, "stop")
                continue
            sequence.out.append(token)
            if sequence.constraint is not None:
                sequence.constraint.take(token)
                if sequence.constraint.complete:  # nothing but a stop token may follow: end it now
                    self._end(sequence, "stop")
                    continue
            if len(sequence.out) >= self.layout.max_tokens:
                self._end(sequence, "length")
            else:
                self.stepping.append(sequence)
        self.state.report(len(self.out), self.total)

    def _grow(self, sequence: _Sequence, result: ItemResult) -> None:
        """The pass's new KV appended to the sequence's block."""
        arena = self.state.arena
        if sequence.block is None:
            sequence.block, sequence.length = self._first_block(sequence, list(result.blocks)), len(sequence.prompt)
            return
        [block] = result.blocks
        held = arena.pages_for(sequence.length)
        sequence.block = arena.concat(sequence.block, block)
        sequence.length += 1
        taken = arena.pages_for(sequence.length) - held
        sequence.promised -= taken
        self.promised -= taken

    def _first_block(self, sequence: _Sequence, blocks: list[int]) -> int:
        """The sequence's block over [document][tail]; the document's own KV kept for a later node when asked."""
        arena = self.state.arena
        document = sequence.lent if sequence.lent is not None else (blocks.pop(0) if len(blocks) == 2 else None)
        [tail] = blocks
        if document is None:
            return tail
        if not self.layout.retain:
            return arena.concat(document, tail)
        joined = arena.concat(arena.view(document, len(sequence.document)), tail)
        self.state.retain(self.alias, (self.layout.preamble, sequence.document), document)
        return joined

    def _end(self, sequence: _Sequence, finish: Finish) -> None:
        drop(self.state, sequence.block)
        sequence.block = None
        self.promised -= sequence.promised
        sequence.promised = 0
        self.out.append(Generated(sequence.row, tuple(sequence.out), finish))


def _allowed(finished: Sequence[tuple[_Sequence, ItemResult]]) -> torch.Tensor | None:
    """The tokens each row may take next: its grammar's, or every token (None when no sequence has a grammar)."""
    masks = [sequence.constraint.allowed() if sequence.constraint is not None else None for sequence, _ in finished]
    present = [m for m in masks if m is not None]
    if not present:
        return None
    everything = torch.ones_like(present[0])
    return torch.stack([everything if m is None else m for m in masks])
