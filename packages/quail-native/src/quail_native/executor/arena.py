"""The KV arena: blocks of per-layer keys and values for token spans at known positions.

A block is the KV of one span (a shared preamble, a document, a frame); items of a forward pass
name the blocks they attend to. The arena counts the tokens it holds so admission can be bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Block:
    id: int
    start: int
    length: int
    keys: list[torch.Tensor]  # per layer [kv_heads, length, head_dim]
    values: list[torch.Tensor]

    @property
    def positions(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.length)


class KVArena:
    def __init__(self) -> None:
        self._blocks: dict[int, Block] = {}
        self._next = 0
        self.tokens_held = 0
        self.peak_tokens = 0

    def add(self, start: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
        block_id = self._next
        self._next += 1
        length = keys[0].shape[1]
        self._blocks[block_id] = Block(block_id, start, length, keys, values)
        self.tokens_held += length
        self.peak_tokens = max(self.peak_tokens, self.tokens_held)
        return block_id

    def get(self, block_id: int) -> Block:
        return self._blocks[block_id]

    def free(self, block_id: int) -> None:
        block = self._blocks.pop(block_id, None)
        if block is not None:
            self.tokens_held -= block.length

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)
