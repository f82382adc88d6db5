"""Projections with prepacked weights compute what F.linear computes, on every row count and layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quail_native.models.projection import Projection, describe, why_unpacked

CPU = torch.device("cpu")
DTYPES = [torch.float32] + ([torch.bfloat16] if why_unpacked(CPU, torch.bfloat16) is None else [])


def weight(rows: int, columns: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, columns, generator=generator) * 0.05).to(dtype)


@pytest.mark.skipif(why_unpacked(CPU, torch.float32) is not None, reason="no oneDNN in this PyTorch")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [0, 1, 7, 63, 1030])
@pytest.mark.parametrize("shape", [(1536, 640), (640, 2048)])
def test_a_packed_projection_equals_f_linear(dtype: torch.dtype, rows: int, shape: tuple[int, int]) -> None:
    w = weight(*shape, dtype)
    project = Projection(w)
    assert project.packed is not None
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(1)).to(dtype)
    got, expected = project(x), F.linear(x, w)
    assert got.shape == expected.shape and got.dtype == dtype
    if dtype == torch.bfloat16:
        # fp32 sums rounded once to bf16. Mostly the very kernel F.linear runs, without its per-call repacking;
        # where oneDNN multiplies in AMX tiles the two are different primitives that may sum in another order,
        # and a sum next to a rounding boundary then lands on the neighbouring bf16 value.
        gap = (got.float() - expected.float()).abs()
        assert (gap > 0).float().mean().item() <= 0.01 if gap.numel() else True
        assert bool((gap <= expected.float().abs() * 2.0 ** -7 + 1e-4).all())
    else:  # fp32 F.linear runs MKL; the blocked sums differ in rounding only
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(why_unpacked(CPU, torch.float32) is not None, reason="no oneDNN in this PyTorch")
def test_inputs_that_are_views_and_row_gathers_multiply_as_f_linear_does() -> None:
    w = weight(512, 640, torch.float32)
    wide = torch.randn(40, 1280, generator=torch.Generator().manual_seed(2))
    strided = wide[:, ::2]
    gathered = wide[:, :640][torch.tensor([3, 17, 5])]
    project = Projection(w)
    for x in (strided, gathered, wide[5:9, 640:]):
        assert torch.allclose(project(x), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_a_weight_onednn_does_not_take_multiplies_with_f_linear_and_says_why() -> None:
    w = weight(64, 32, torch.float64)
    project = Projection(w)
    assert project.packed is None
    x = torch.randn(5, 32, dtype=torch.float64)
    assert torch.equal(project(x), F.linear(x, w))
    assert describe(CPU, torch.float64) == f"F.linear ({why_unpacked(CPU, torch.float64)})"
    assert "float64" in describe(CPU, torch.float64)
    assert describe(torch.device("cuda"), torch.bfloat16) == "F.linear (not on a CPU (cuda))"
