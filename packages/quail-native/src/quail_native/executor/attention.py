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

from quail_native.models.transformer import LayerType


@dataclass(frozen=True)
class Segment:
    rows: slice
    context: torch.Tensor  # long [columns]: the arena slots (rows of each layer's KV) its queries read
    masks: dict[LayerType, torch.Tensor]  # bool [rows, columns + rows], True = may attend


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
