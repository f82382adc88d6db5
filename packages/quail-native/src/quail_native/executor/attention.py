"""Masks for a packed pass: each item sees its parent blocks and its own earlier tokens, nothing else.

Sliding-window layers additionally drop keys `window` or more positions behind the query, by the
tokens' true positions, so a packed item attends exactly as it would in its own full prompt.
"""

from __future__ import annotations

import torch

from quail_native.models.transformer import LayerType


def packed_masks(item_of_row: torch.Tensor, row_positions: torch.Tensor, parents: torch.Tensor,
                 block_of_column: torch.Tensor, column_positions: torch.Tensor,
                 window: int | None) -> dict[LayerType, torch.Tensor]:
    """Boolean masks [T, C + T] (True = may attend) for full and sliding-window layers.

    `parents[i, b]` says whether item i attends to context block b; `block_of_column` names the
    block of each context column; rows are the new tokens, grouped by item, in position order.
    """
    rows = item_of_row.shape[0]
    to_context = parents[item_of_row][:, block_of_column] if block_of_column.numel() else torch.zeros(
        rows, 0, dtype=torch.bool)
    index = torch.arange(rows)
    to_new = (item_of_row[:, None] == item_of_row[None, :]) & (index[None, :] <= index[:, None])
    full = torch.cat((to_context, to_new), dim=1)
    masks: dict[LayerType, torch.Tensor] = {"full": full}
    if window is not None:
        keys = torch.cat((column_positions, row_positions))
        masks["sliding"] = full & ((row_positions[:, None] - keys[None, :]) < window)
    else:
        masks["sliding"] = full
    return masks
