"""The RoPE rows a pass gathers from the model's table are exactly the rows computed for its positions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from quail_native.models.transformer import ROPE_TABLE_POSITIONS, Arch, RopeTables, rope_tables


def gemma_like() -> Arch:
    """Gemma 3's RoPE numbers: two layer kinds with their own base, one scaled."""
    return Arch(family="gemma3", vocab=50, hidden=64, layers=2, heads=4, kv_heads=1, head_dim=256, ffn=128,
                norm_eps=1e-6, layer_types=("sliding", "full"), rope_theta={"full": 1e6, "sliding": 1e4},
                rope_factor={"full": 8.0, "sliding": 1.0}, sliding_window=512, attention_scale=0.0625,
                activation="gelu_tanh", tied_embeddings=True, embed_scale=8.0, gemma_norms=True)


def assert_same(got: dict[str, tuple[torch.Tensor, ...]], want: dict[str, tuple[torch.Tensor, ...]]) -> None:
    assert got.keys() == want.keys()
    for kind in want:
        for gathered, computed in zip(got[kind], want[kind], strict=True):
            assert gathered.shape == computed.shape and gathered.dtype == computed.dtype
            assert gathered.is_contiguous()  # the fused norm + RoPE kernel reads contiguous tables
            assert torch.equal(gathered, computed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathered_rows_are_bit_identical_to_computed_ones_across_growth(dtype: torch.dtype) -> None:
    """Passes in any order of reach — the table grows past the furthest position yet and keeps answering
    exactly; negative positions and those past what a table keeps are computed as they are."""
    arch = gemma_like()
    tables = RopeTables(arch)

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.integers(-5, ROPE_TABLE_POSITIONS + 5), max_size=300))
    @example([0]).via("the first table: one row")
    @example([1, 2]).via("grown to hold the furthest position")
    @example([4, 3, 2]).via("exactly to its last row")
    @example([-1, 3]).via("a negative position")
    @example([2, ROPE_TABLE_POSITIONS]).via("past the positions a table keeps")
    def exact(positions: list[int]) -> None:
        asked = torch.tensor(positions, dtype=torch.long)
        assert_same(tables(asked, dtype), rope_tables(arch, asked, dtype))

    exact()
