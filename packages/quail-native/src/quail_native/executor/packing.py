"""Packed forward passes: many variable-length items, explicit positions, one model call.

An item is a run of new tokens at known positions that attends to some KV blocks of the arena
(its parents) and to its own earlier tokens. Siblings in one pass never see each other, except that
an item may continue the first tokens of an earlier sibling with the same parents (its `lender`):
a document that borrows a prefix computes its tail in the pass that computes the prefix. After
the pass, spans of an item's new KV may be kept as blocks, and hidden states are returned only
at the item's readout offsets — the head never runs over every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from quail_native.executor.arena import KeptSpan, KVArena
from quail_native.executor.attention import ItemSpan, pass_segments
from quail_native.models.transformer import Arch, LayerType, Transformer, WrittenRows

Span = tuple[int, int]


@dataclass(frozen=True)
class Item:
    tokens: tuple[int, ...]
    start: int
    parents: tuple[int, ...] = ()
    readout: tuple[int, ...] = ()
    keep: tuple[Span, ...] = ()
    lender: Item | None = None
    """An earlier item of the same pass, with the same parents, whose first `lent` tokens come before this
    item's own: it attends to their rows in the pass, before any block holds their KV."""
    lent: int = 0
    into: int | None = None
    """A block reserved for this item's whole KV (`KVArena.reserve`), written during the pass before any
    layer attends, so that the other items of the pass read it as context; it is the item's only block."""

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("an item computes at least one token")
        if self.into is not None and (self.keep or self.parents or self.lender is not None):
            raise ValueError("an item computed into a reserved block keeps nothing else and has no parents or lender")
        lender = self.lender
        if lender is not None and not (0 < self.lent <= len(lender.tokens) and lender.parents == self.parents
                                       and lender.start + self.lent == self.start):
            raise ValueError(f"an item continuing {self.lent} tokens of a sibling at {lender.start} starts at "
                             f"{self.start} with the same parents (it has {self.parents}, the sibling "
                             f"{lender.parents} and {len(lender.tokens)} tokens)")

    def in_pass_rows(self) -> list[tuple[Item, int]]:
        """The siblings whose first rows this item attends to in the pass, nearest first: its lender's
        first `lent`, then whatever its lender continues in turn."""
        seen, item = [], self
        while item.lender is not None:
            seen.append((item.lender, item.lent))
            item = item.lender
        return seen


@dataclass
class ItemResult:
    hidden: torch.Tensor
    blocks: tuple[int, ...]


@dataclass
class PassCounters:
    passes: int = 0
    fresh_tokens: int = 0
    cached_tokens: int = 0
    model_flops: float = 0.0

    def snapshot(self) -> tuple[int, int, int, float]:
        return self.passes, self.fresh_tokens, self.cached_tokens, self.model_flops


def item_flops(arch: Arch, context: int, tokens: int, readout: Sequence[int]) -> float:
    """Model FLOPs of computing `tokens` new tokens after `context` resident ones, read at the `readout`
    offsets: the dense projections and MLP, and attention over the keys each query really sees (sliding
    layers at most `window`). The last layer gives every token its k and v but runs the rest only for
    the read rows."""
    kv = 2.0 * arch.hidden * arch.head_dim * 2 * arch.kv_heads
    dense = 2.0 * (arch.hidden * arch.head_dim * (2 * arch.heads + 2 * arch.kv_heads) + 3 * arch.hidden * arch.ffn)
    per_pair = 4.0 * arch.heads * arch.head_dim
    window = arch.sliding_window or 0

    def keys_seen(kind: LayerType) -> float:
        if kind == "sliding" and window:
            return _keys_within(context, tokens, window)
        return tokens * context + tokens * (tokens + 1) / 2

    *inner, last = arch.layer_types
    reach = window if last == "sliding" and window else context + tokens
    read_keys = sum(min(context + offset + 1, reach) for offset in readout)
    return (sum(dense * tokens + per_pair * keys_seen(kind) for kind in inner)
            + kv * tokens + (dense - kv) * len(readout) + per_pair * read_keys)


def _keys_within(context: int, tokens: int, window: int) -> float:
    """Σ over the new tokens of min(keys before and at it, window)."""
    first, last = context + 1, context + tokens
    if last <= window:
        return (first + last) * tokens / 2
    if first >= window:
        return float(window * tokens)
    below = window - first + 1
    return (first + window) * below / 2 + window * (tokens - below)


@dataclass
class Packer:
    model: Transformer
    arena: KVArena
    device: torch.device
    counters: PassCounters = field(default_factory=PassCounters)

    def run(self, items: Sequence[Item]) -> list[ItemResult]:
        """One forward pass over `items` (results come back in the given order); an item's lender must be
        one of them, given before it."""
        if not items:
            return []
        _check_lenders(items)
        order = sorted(range(len(items)), key=lambda i: items[i].parents)  # stable: lenders stay first
        ordered = [items[i] for i in order]
        block_ids = list(dict.fromkeys(b for item in ordered for b in item.parents))
        context = list(zip(self.arena.keys, self.arena.values, strict=True))  # read in place at block slots
        rows = self._rows(ordered)
        layout = pass_segments(self._spans(ordered, block_ids), self.model.arch.sliding_window).to(self.device)
        output = self.model(rows.tokens.to(self.device), rows.positions.to(self.device), context, layout,
                            rows.readout.to(self.device), self._written_early(ordered))
        self._count(ordered)
        results = self._results(ordered, output.hidden, output.keys, output.values)
        back: list[ItemResult | None] = [None] * len(items)
        for position, index in enumerate(order):
            back[index] = results[position]
        return [r for r in back if r is not None]

    def _spans(self, items: Sequence[Item], block_ids: list[int]) -> list[ItemSpan]:
        columns = {b: (self.arena.slots(b), self.arena.get(b).positions) for b in block_ids}
        spans, row, first_row = [], 0, {}
        for item in items:
            parts = [columns[b] for b in item.parents]
            index = torch.cat([p[0] for p in parts]) if parts else torch.zeros(0, dtype=torch.long)
            positions = torch.cat([p[1] for p in parts]) if parts else torch.zeros(0, dtype=torch.long)
            sees = tuple((first_row[id(lender)], first_row[id(lender)] + lent) for lender, lent in item.in_pass_rows())
            first_row[id(item)] = row
            spans.append(ItemSpan(row, row + len(item.tokens), torch.arange(item.start, item.start + len(item.tokens)),
                                  index, positions, sees))
            row += len(item.tokens)
        return spans

    def _written_early(self, items: Sequence[Item]) -> WrittenRows | None:
        """The rows of items computed into reserved blocks, and the arena slots they go to."""
        rows, slots, offset = [], [], 0
        for item in items:
            if item.into is not None:
                rows.append(torch.arange(offset, offset + len(item.tokens)))
                slots.append(self.arena.slots(item.into))
            offset += len(item.tokens)
        if not rows:
            return None
        return WrittenRows(torch.cat(rows).to(self.device), torch.cat(slots))

    @staticmethod
    def _rows(items: Sequence[Item]) -> _Rows:
        tokens, positions, readout = [], [], []
        offset = 0
        for item in items:
            tokens.extend(item.tokens)
            positions.extend(range(item.start, item.start + len(item.tokens)))
            readout.extend(offset + r for r in item.readout)
            offset += len(item.tokens)
        return _Rows(_long(tokens), _long(positions), _long(readout))

    def _count(self, items: Sequence[Item]) -> None:
        self.counters.passes += 1
        self.counters.fresh_tokens += sum(len(i.tokens) for i in items)
        for item in items:
            context = (sum(self.arena.get(b).length for b in item.parents)
                       + sum(lent for _, lent in item.in_pass_rows()))  # computed once, in the lender's rows
            self.counters.cached_tokens += context
            self.counters.model_flops += item_flops(self.model.arch, context, len(item.tokens), item.readout)

    def _results(self, items: Sequence[Item], hidden: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor]) -> list[ItemResult]:
        """Each item's read-out rows, and its blocks: the one it was computed into, then its kept spans (all the
        pass's kept spans stored in one go)."""
        spans: list[KeptSpan] = []
        owners: list[int] = []
        offset = 0
        for index, item in enumerate(items):
            for span_start, span_length in item.keep:
                if span_length > 0:
                    spans.append(KeptSpan(item.start + span_start, offset + span_start, span_length))
                    owners.append(index)
            offset += len(item.tokens)
        kept: list[list[int]] = [[] if item.into is None else [item.into] for item in items]
        for index, block in zip(owners, self.arena.add_spans(spans, keys, values), strict=True):
            kept[index].append(block)
        results, read = [], 0
        for item, blocks in zip(items, kept, strict=True):
            results.append(ItemResult(hidden[read: read + len(item.readout)], tuple(blocks)))
            read += len(item.readout)
        return results


def _check_lenders(items: Sequence[Item]) -> None:
    earlier: set[int] = set()
    for item in items:
        if item.lender is not None and id(item.lender) not in earlier:
            raise ValueError("an item's lender must come before it in the same pass")
        earlier.add(id(item))


@dataclass
class _Rows:
    tokens: torch.Tensor
    positions: torch.Tensor
    readout: torch.Tensor


def _long(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)
