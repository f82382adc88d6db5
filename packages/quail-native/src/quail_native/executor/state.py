"""What outlives one model node on a native engine: the arena, preamble blocks, KV kept for later nodes,
and the loop every scheduler runs — ask for items that fit a pass, run it, hand back the results.

The schedulers (`filters.py`, `joins.py`, `labels.py`) turn each model node's work into packed
passes over this state.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from quail_native.executor.arena import KVArena
from quail_native.executor.memory import KVCounters, Memory
from quail_native.executor.packing import Item, ItemResult, Packer

Tag = TypeVar("Tag")
Tokens = tuple[int, ...]
DocKey = tuple[Tokens, Tokens]
"""(preamble, document tokens): the KV of a document prefix depends on nothing else."""


@dataclass
class Budget:
    """Tokens per chunk — one packed forward pass (`EngineConfig.chunk_tokens`); KV pages are the arena's."""

    chunk_tokens: int


@dataclass
class SharedState:
    """What outlives one node: the arena, preamble blocks, and documents' KV kept for later nodes."""

    packer: Packer
    memory: Memory
    budget: Budget
    preambles: dict[Tokens, int] = field(default_factory=dict)
    retained: dict[DocKey, int] = field(default_factory=dict)
    retained_by: dict[str, set[DocKey]] = field(default_factory=dict)
    evicted: set[DocKey] = field(default_factory=set)
    progress: Callable[[int, int], None] | None = None
    pending: list[Item] = field(default_factory=list)
    """Preambles asked for since the last pass: they ride at the front of the next one."""
    kept_now: set[DocKey] | None = None
    """The documents whose KV the node running in `reading` has kept for a later one."""

    def report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)

    @property
    def arena(self) -> KVArena:
        return self.packer.arena

    @property
    def counters(self) -> KVCounters:
        return self.memory.counters

    @property
    def room(self) -> int:
        """Tokens the next pass has for the items asked for it (the pending preambles take theirs first)."""
        return self.budget.chunk_tokens - sum(len(item.tokens) for item in self.pending)

    def run(self, items: Sequence[Item]) -> list[ItemResult]:
        """One pass, with the pending preambles at its front; the pages reserved for it are now allocated."""
        ahead, self.pending = self.pending, []
        try:
            results = self.packer.run([*ahead, *items])[len(ahead):]
        except BaseException:
            self._unwritten(ahead)
            raise
        self.memory.pass_ran()
        return results

    def _unwritten(self, preambles: Sequence[Item]) -> None:
        """A pass that failed leaves its preambles' reserved blocks unwritten: nobody may read them."""
        for item in preambles:
            if item.into is not None:
                self.preambles.pop(item.tokens, None)
                self.arena.free(item.into)

    def preamble(self, tokens: Tokens) -> int:
        """The block of a preamble, computed once and shared by every document after it: reserved now and
        computed at the front of the next pass, whose items already read it (no pass of its own)."""
        block = self.preambles.get(tokens)
        if block is None or block not in self.arena:
            self.memory.claim(self.arena.pages_for(len(tokens)))
            block = self.arena.reserve(0, len(tokens))
            self.pending.append(Item(tokens, 0, into=block))
            self.preambles[tokens] = block
        return block

    @contextmanager
    def reading(self, alias: str) -> Iterator[None]:
        """One node's run over `alias`'s documents: what earlier nodes kept for `alias` and this one neither took
        nor kept again is freed when it ends (no node after it asked for it)."""
        stale = set(self.retained_by.get(alias, ()))
        self.kept_now = set()
        try:
            yield
        finally:
            kept, self.kept_now = self.kept_now, None
            self.release(alias, stale - kept)

    def retain(self, alias: str, key: DocKey, block: int, reuse: float = 1.0) -> None:
        """Keep a document's KV for a later node over `alias` (evictable, recomputed if evicted)."""
        if self.kept_now is not None:
            self.kept_now.add(key)
        earlier = self.retained.get(key)
        if earlier is not None and earlier != block:
            self.arena.free(block)
            return
        self.retained[key] = block
        self.retained_by.setdefault(alias, set()).add(key)
        self.memory.keep(block, reuse, lambda: self._lost(alias, key))

    def _lost(self, alias: str, key: DocKey) -> None:
        self.retained.pop(key, None)
        self.retained_by.get(alias, set()).discard(key)
        self.evicted.add(key)

    def take(self, key: DocKey) -> int | None:
        """A kept document's KV for an anchor (now in flight), or None: a miss, recomputed if it was evicted."""
        block = self.retained.pop(key, None)
        if block is None:
            self.counters.misses += 1
            if key in self.evicted:
                self.evicted.discard(key)
                self.counters.recomputed_tokens += len(key[1])
            return None
        self.counters.hits += 1
        self.memory.unkeep(block)
        for keys in self.retained_by.values():
            keys.discard(key)
        return block

    def kept(self, key: DocKey) -> bool:
        """Whether an earlier node kept this document's KV (it may have been evicted since: `take` then counts a
        miss and the tokens recomputed)."""
        return key in self.retained or key in self.evicted

    def release(self, alias: str, keys: Collection[DocKey] | None = None) -> None:
        """Free whatever was kept for `alias` (only `keys` of it, when given) and not consumed: the node that
        would read it has finished."""
        held = self.retained_by.get(alias, set())
        for key in list(held if keys is None else held & set(keys)):
            held.discard(key)
            block = self.retained.pop(key, None)
            if block is not None:
                self.memory.unkeep(block)
                self.arena.free(block)
        if not held:
            self.retained_by.pop(alias, None)

    def forget(self) -> None:
        for block in list(self.preambles.values()) + list(self.retained.values()):
            self.memory.unkeep(block)
            self.arena.free(block)
        self.preambles.clear()
        self.pending.clear()
        self.retained.clear()
        self.retained_by.clear()
        self.evicted.clear()


@dataclass
class Batch(Generic[Tag]):
    """The items a scheduler has put in the next pass so far, each with its tag, within the pass's room."""

    room: int
    """Tokens the pass has for this scheduler's items."""
    entries: list[tuple[Item, Tag]] = field(default_factory=list)
    used: int = 0

    def fits(self, tokens: int) -> bool:
        return self.used + tokens <= self.room

    def add(self, item: Item, tag: Tag) -> None:
        self.entries.append((item, tag))
        self.used += len(item.tokens)

    def __bool__(self) -> bool:
        return bool(self.entries)


@dataclass(frozen=True)
class Lead:
    """Items a node must have answered before it can judge its own (its calibration prompts).

    They ride at the front of the node's first pass, with as many of the node's items as fit behind
    them, instead of a small pass of their own (63–138 tokens on the bench's nodes, ~40 ms more than
    the same tokens in a full pass on a 2-core CPU). Results come back in pass order, so `finish` has
    them all before the node sees any result of its own."""

    items: Sequence[Item]
    finish: Callable[[list[ItemResult]], None]


def run_passes(state: SharedState, fill: Callable[[Batch[Tag]], None], done: Callable[[Tag, ItemResult], None],
               after_pass: Callable[[], None] = lambda: None, lead: Lead | None = None) -> None:
    """Keep asking the scheduler to `fill` a pass and running it until it adds nothing; the `lead` items first."""
    ahead = list(lead.items) if lead is not None else []
    while True:
        batch: Batch[Tag] = Batch(state.room - sum(len(item.tokens) for item in ahead))
        if batch.room > 0:
            fill(batch)
        if not ahead and not batch:
            return
        results = state.run([*ahead, *(item for item, _ in batch.entries)])
        if lead is not None and ahead:
            lead.finish(results[:len(ahead)])
        for (_, tag), result in zip(batch.entries, results[len(ahead):], strict=True):
            done(tag, result)
        ahead = []
        after_pass()


def drop(state: SharedState, block: int | None) -> None:
    if block is not None:
        state.arena.free(block)
