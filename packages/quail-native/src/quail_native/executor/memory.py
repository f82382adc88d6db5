"""What the arena's pages hold beyond work in flight, and what to give up when pages run short.

Kept KV (a filter survivor's document for the join anchored on it, an anchor's document for a
later join, a borrowed prefix waiting for its borrower) is evictable: when admission needs pages,
the entry with the lowest priority = P(reuse) × recompute cost / pages goes first, and whoever
needed it computes it again later (counted as recomputed tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from quail import Refusal, RefusalError
from quail_native.executor.arena import KVArena
from quail_native.models.transformer import Arch


@dataclass(frozen=True)
class RecomputeCost:
    """FLOPs to recompute a span of KV: dense projections + MLP per token, attention per pair."""

    dense_flops_per_token: float
    attention_flops_per_pair: float

    @classmethod
    def of(cls, arch: Arch) -> RecomputeCost:
        attention = arch.hidden * arch.head_dim * (2 * arch.heads + 2 * arch.kv_heads)
        mlp = 3 * arch.hidden * arch.ffn
        return cls(2.0 * arch.layers * (attention + mlp), 4.0 * arch.heads * arch.head_dim * arch.layers)

    def __call__(self, start: int, length: int) -> float:
        pairs = length * start + length * (length + 1) / 2
        return self.dense_flops_per_token * length + self.attention_flops_per_pair * pairs


@dataclass
class KVCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    recomputed_tokens: int = 0

    def snapshot(self) -> tuple[int, int, int, int]:
        return self.hits, self.misses, self.evictions, self.recomputed_tokens


@dataclass
class Kept:
    block: int
    reuse: float
    on_evict: Callable[[], None]


@dataclass
class Memory:
    """The arena plus its evictable entries, and admission that reserves pages for a pass being formed."""

    arena: KVArena
    cost: RecomputeCost
    counters: KVCounters = field(default_factory=KVCounters)
    kept: dict[int, Kept] = field(default_factory=dict)
    reserved: int = 0

    def keep(self, block: int, reuse: float, on_evict: Callable[[], None]) -> None:
        self.kept[block] = Kept(block, reuse, on_evict)

    def unkeep(self, block: int) -> None:
        self.kept.pop(block, None)

    def admit(self, pages: int, busy: bool) -> bool:
        """Reserve `pages` for the pass being formed; False (wait) only while other work holds pages."""
        if pages > self.arena.free_pages - self.reserved:
            self.make_room(pages + self.reserved)
        if pages <= self.arena.free_pages - self.reserved:
            self.reserved += pages
            return True
        if busy or self.reserved:
            return False
        raise self._too_small(pages)

    def claim(self, pages: int) -> None:
        """Room for `pages` the arena allocates at once rather than at the next pass (`KVArena.reserve`):
        kept entries are evicted for them, and an arena that cannot hold them is refused."""
        if pages > self.arena.free_pages - self.reserved:
            self.make_room(pages + self.reserved)
        if pages > self.arena.free_pages - self.reserved:
            raise self._too_small(pages)

    def _too_small(self, pages: int) -> RefusalError:
        return RefusalError(Refusal(
            "the KV arena is too small for one document",
            (f"needed {pages} pages of {self.arena.page_tokens} tokens, {self.arena.free_pages} of "
             f"{self.arena.pages} free with nothing else in flight: raise EngineConfig.kv_budget_bytes",),
        ))

    def pass_ran(self) -> None:
        """The pass allocated what was reserved for it."""
        self.reserved = 0

    def make_room(self, pages: int) -> None:
        """Evict kept entries, lowest priority first, until `pages` are free or nothing is left to evict."""
        while self.arena.free_pages < pages:
            victim = self._lowest_priority()
            if victim is None:
                return
            del self.kept[victim.block]
            self.arena.free(victim.block)
            self.counters.evictions += 1
            victim.on_evict()

    def _lowest_priority(self) -> Kept | None:
        best: tuple[float, Kept] | None = None
        for entry in self.kept.values():
            if entry.block not in self.arena:
                continue
            gained = self.arena.exclusive_pages(entry.block)
            if gained == 0:
                continue
            block = self.arena.get(entry.block)
            priority = entry.reuse * self.cost(block.start, block.length) / gained
            if best is None or priority < best[0]:
                best = (priority, entry)
        return None if best is None else best[1]
