"""Who attends to what in a packed pass, as segments that each cost only what they need.

Items of a pass are grouped by the KV blocks they attend to (their parents). A segment is a run of
rows of one group: its queries attend to the group's context columns and to the segment's own new
tokens, under a mask that keeps each item causal and blind to its siblings — but for the first rows
of the siblings it continues (`Item.lender`), which stay in its segment. Splitting a group into
segments no longer than its context (or its longest item) keeps the masked-out waste of dense
attention small, whether items are long documents over a short preamble or short suffixes over a
long anchor. Sliding-window layers also drop keys `window` or more positions behind the query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quail_native.models import kernels
from quail_native.models.transformer import LayerType


@dataclass(frozen=True)
class Segment:
    rows: slice
    context: torch.Tensor  # long [columns]: the arena slots (rows of each layer's KV) its queries read
    masks: dict[LayerType, torch.Tensor]  # bool [rows, columns + rows], True = may attend


@dataclass(frozen=True)
class PassSegments:
    """A pass's segments, and the same in the flat layout one attention call for all of them reads: each
    segment's shape, context slots and mask, one after the other in pass order (the segments' masks are views
    of the flat ones)."""

    segments: tuple[Segment, ...]
    shapes: torch.Tensor  # long [segments, 2]: (own rows, context columns)
    slots: torch.Tensor  # long [Σ context columns]
    masks: dict[LayerType, torch.Tensor]  # bool [Σ rows × (context columns + rows)]
    flat: kernels.FlatSegments | None  # shapes and slots checked for the fused kernel, None where it cannot read them

    def to(self, device: torch.device) -> PassSegments:
        if self.slots.device == device:
            return self
        return _flat(self.segments, {kind: mask.to(device) for kind, mask in self.masks.items()},
                     self.slots.to(device), self.shapes)


def pass_segments(items: Sequence[ItemSpan], window: int | None) -> PassSegments:
    """`segments`, laid out for one attention call (one flat mask for both layer kinds without a window)."""
    found = segments(items, window)

    def flat(kind: LayerType) -> torch.Tensor:
        return torch.cat([s.masks[kind].flatten() for s in found]) if found else torch.zeros(0, dtype=torch.bool)

    full = flat("full")
    masks: dict[LayerType, torch.Tensor] = {"full": full, "sliding": full if window is None else flat("sliding")}
    slots = torch.cat([s.context for s in found]) if found else torch.zeros(0, dtype=torch.long)
    return _flat(found, masks, slots, torch.tensor([[s.rows.stop - s.rows.start, s.context.numel()] for s in found],
                                                   dtype=torch.long).reshape(-1, 2))


def _flat(found: Sequence[Segment], masks: dict[LayerType, torch.Tensor], slots: torch.Tensor,
          shapes: torch.Tensor) -> PassSegments:
    """Segments over views of the flat `masks` and `slots`."""
    views, mask_at, slot_at = [], 0, 0
    for segment in found:
        rows, context = segment.rows.stop - segment.rows.start, segment.context.numel()
        size = rows * (context + rows)
        views.append(Segment(segment.rows, slots[slot_at: slot_at + context],
                             {kind: mask[mask_at: mask_at + size].view(rows, context + rows)
                              for kind, mask in masks.items()}))
        mask_at += size
        slot_at += context
    return PassSegments(tuple(views), shapes, slots, masks, kernels.flat_segments(shapes, slots))


@dataclass(frozen=True)
class ItemSpan:
    """Rows [start, stop) of one item in the pass, its positions, and its context columns."""

    start: int
    stop: int
    positions: torch.Tensor
    context: torch.Tensor
    context_positions: torch.Tensor
    sees: tuple[tuple[int, int], ...] = ()
    """Rows [start, stop) of the pass, before this item's own, that it also attends to (its lenders')."""


def segments(items: Sequence[ItemSpan], window: int | None) -> list[Segment]:
    """Consecutive items with the same context become segments; items must be ordered by group. A long run
    splits only where no later item of it sees rows before the split."""
    out: list[Segment] = []
    run: list[ItemSpan] = []
    for index, item in enumerate(items):
        if run and (not _same_context(run[0], item) or (_too_long(run, item) and _may_split(items, index))):
            out.append(_segment(run, window))
            run = []
        run.append(item)
    if run:
        out.append(_segment(run, window))
    return out


def _may_split(items: Sequence[ItemSpan], index: int) -> bool:
    """Whether no item from `index` on (in its context group) sees rows before item `index`."""
    boundary = items[index].start
    for later in items[index:]:
        if not _same_context(items[index], later):
            return True
        if any(start < boundary for start, _ in later.sees):
            return False
    return True


def _same_context(a: ItemSpan, b: ItemSpan) -> bool:
    return a.context.shape == b.context.shape and bool(torch.equal(a.context, b.context))


def _too_long(run: list[ItemSpan], item: ItemSpan) -> bool:
    rows = item.stop - run[0].start
    longest = max([s.stop - s.start for s in run] + [item.stop - item.start])
    return rows > max(run[0].context.numel(), longest)


def _segment(run: list[ItemSpan], window: int | None) -> Segment:
    start, stop = run[0].start, run[-1].stop
    owner = torch.cat([torch.full((s.stop - s.start,), i, dtype=torch.long) for i, s in enumerate(run)])
    positions = torch.cat([s.positions for s in run])
    index = torch.arange(stop - start)
    to_new = (owner[:, None] == owner[None, :]) & (index[None, :] <= index[:, None])
    for span in run:
        for seen_start, seen_stop in span.sees:
            to_new[span.start - start: span.stop - start, seen_start - start: seen_stop - start] = True
    columns = run[0].context.numel()
    full = torch.cat((torch.ones(stop - start, columns, dtype=torch.bool), to_new), dim=1)
    masks: dict[LayerType, torch.Tensor] = {"full": full, "sliding": full}
    if window is not None:
        keys = torch.cat((run[0].context_positions, positions))
        masks["sliding"] = full & ((positions[:, None] - keys[None, :]) < window)
    return Segment(slice(start, stop), run[0].context, masks)
