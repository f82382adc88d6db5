"""The paged KV arena: keys and values in fixed-size pages, allocated once from a budget.

A block is the KV of one span of positions (a shared preamble, a document, a frame), stored in
pages. Blocks may share leading pages — a document borrowing the common prefix of another document
holds references to that document's first pages, its part-page included (read only up to the
block's length) — so pages are reference-counted and return to the free list the moment no block
reads them. Continuing a block that ends inside a page copies that part-page and the continuation
into fresh pages; pages written once are never written again. Nothing is allocated after start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


class ArenaFull(RuntimeError):
    """More pages were asked for than are free; admission should have prevented it."""


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize


@dataclass(frozen=True)
class KeptSpan:
    """Tokens of a pass kept as a block: `length` of them from pass row `row`, at positions from `start`."""

    start: int
    row: int
    length: int


@dataclass(frozen=True)
class Block:
    id: int
    start: int
    length: int
    pages: tuple[int, ...]

    @property
    def positions(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.length)


class KVArena:
    def __init__(self, shape: KVShape, pages: int, page_tokens: int, device: torch.device) -> None:
        if pages < 1 or page_tokens < 1:
            raise ValueError(f"an arena needs at least one page of one token, got {pages} × {page_tokens}")
        self.shape = shape
        self.page_tokens = page_tokens
        self.pages = pages
        slots = pages * page_tokens
        # one tensor per kind for every layer, so a copy between slots is one op for all layers (a decode step's
        # part-page copy was 36 ops per sequence); `keys` / `values` are its per-layer views [kv_heads, slots, dim]
        self._all_keys = torch.empty(shape.layers, shape.kv_heads, slots, shape.head_dim, dtype=shape.dtype,
                                     device=device)
        self._all_values = torch.empty_like(self._all_keys)
        self.keys = list(self._all_keys.unbind(0))
        self.values = list(self._all_values.unbind(0))
        self._references = [0] * pages
        self._free = list(range(pages - 1, -1, -1))
        self._blocks: dict[int, Block] = {}
        self._next = 0
        self.peak_pages = 0

    @classmethod
    def from_budget(cls, shape: KVShape, budget_bytes: float, page_tokens: int, device: torch.device) -> KVArena:
        pages = int(budget_bytes // (shape.bytes_per_token() * page_tokens))
        return cls(shape, max(pages, 1), page_tokens, device)

    # -- accounting ---------------------------------------------------------------------------

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_tokens)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.pages - len(self._free)

    def exclusive_pages(self, block_id: int) -> int:
        """Pages that freeing this block would return (those no other block reads)."""
        return sum(1 for p in self._blocks[block_id].pages if self._references[p] == 1)

    # -- blocks -------------------------------------------------------------------------------

    def add_spans(self, spans: Sequence[KeptSpan], keys: list[torch.Tensor], values: list[torch.Tensor]) -> list[int]:
        """Store spans of one pass's KV (per layer [kv_heads, rows, head_dim]), each in fresh pages of its own, with
        one copy per kind for all of them and every layer: a copy per span and layer cost about 5 µs of dispatch, and
        Gemma 3 has 36 per span. Nothing is allocated when they do not all fit."""
        needed = sum(self.pages_for(span.length) for span in spans)
        if needed > len(self._free):
            raise ArenaFull(f"{needed} KV pages asked for, {len(self._free)} of {self.pages} free")
        pages = [self._allocate(self.pages_for(span.length)) for span in spans]
        if spans:
            device = keys[0].device
            targets = torch.cat([self._rows(p, span.length) for p, span in zip(pages, spans, strict=True)])
            sources = torch.cat([torch.arange(span.row, span.row + span.length, device=device) for span in spans])
            for every, layers in ((self._all_keys, keys), (self._all_values, values)):
                every.index_copy_(2, targets, torch.stack([layer.index_select(1, sources) for layer in layers]))
        return [self._register(span.start, span.length, p) for span, p in zip(spans, pages, strict=True)]

    def reserve(self, start: int, length: int) -> int:
        """A block of fresh pages for a span not computed yet: the pass that computes it writes its KV there
        layer by layer (`Item.into`), and the other items of that pass already read it as context."""
        return self._register(start, length, self._allocate(self.pages_for(length)))

    def view(self, block_id: int, tokens: int) -> int:
        """A new block over the first `tokens` of a block, sharing its pages (a part-page too)."""
        block = self._blocks[block_id]
        if not 0 < tokens <= block.length:
            raise ValueError(f"a view covers 1 to {block.length} tokens of its block, not {tokens}")
        pages = block.pages[: self.pages_for(tokens)]
        for page in pages:
            self._references[page] += 1
        return self._register(block.start, tokens, pages)

    def continuation_pages(self, first_length: int, second_length: int) -> int:
        """Pages `concat` allocates beyond those its second block frees: 1 when the first ends in a part-page."""
        return 1 if first_length % self.page_tokens and second_length else 0

    def concat(self, first: int, second: int) -> int:
        """One block of `first` followed by `second` (which starts right after it); both ids are consumed.

        A first block ending on a page boundary is continued by reference; one ending inside a page
        gets its part-page and the second block copied into fresh pages after its whole pages.
        """
        a, b = self._blocks[first], self._blocks[second]
        if b.start != a.start + a.length:
            raise ValueError("a block is continued only at the position right after it")
        whole, partial = divmod(a.length, self.page_tokens)
        reused = a.pages[:whole] if partial else a.pages + b.pages
        for page in reused:
            self._references[page] += 1
        fresh = self._allocate(self.pages_for(a.length + b.length) - whole) if partial else ()
        pages = reused + fresh
        if fresh:
            start = whole * self.page_tokens
            source = torch.cat((self._rows(a.pages, a.length)[start:], self._rows(b.pages, b.length)))
            target = self._rows(pages, a.length + b.length)[start:]
            for every in (self._all_keys, self._all_values):
                every.index_copy_(2, target, every.index_select(2, source))
        joined = self._register(a.start, a.length + b.length, pages)
        self.free(first)
        self.free(second)
        return joined

    def get(self, block_id: int) -> Block:
        return self._blocks[block_id]

    def free(self, block_id: int) -> None:
        block = self._blocks.pop(block_id, None)
        if block is None:
            return
        for page in block.pages:
            self._references[page] -= 1
            if self._references[page] == 0:
                self._free.append(page)

    def slots(self, block_id: int) -> torch.Tensor:
        """The rows of the per-layer `keys` / `values` that hold a block's tokens, in order: attention
        reads a block in place through them (no copy of the context per pass)."""
        block = self._blocks[block_id]
        return self._rows(block.pages, block.length)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    # -- internals ----------------------------------------------------------------------------

    def _allocate(self, count: int) -> tuple[int, ...]:
        if count > len(self._free):
            raise ArenaFull(f"{count} KV pages asked for, {len(self._free)} of {self.pages} free")
        pages = tuple(self._free.pop() for _ in range(count))
        for page in pages:
            self._references[page] = 1
        self.peak_pages = max(self.peak_pages, self.used_pages)
        return pages

    def _register(self, start: int, length: int, pages: tuple[int, ...]) -> int:
        block_id = self._next
        self._next += 1
        self._blocks[block_id] = Block(block_id, start, length, pages)
        return block_id

    def _rows(self, pages: tuple[int, ...], length: int) -> torch.Tensor:
        device = self.keys[0].device
        base = torch.tensor(pages, dtype=torch.long, device=device)[:, None] * self.page_tokens
        return (base + torch.arange(self.page_tokens, device=device)[None, :]).reshape(-1)[:length]
