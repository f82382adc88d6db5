"""The fused CPU kernels against float64 references and torch's eager ops; the eager fallback when
they cannot be built."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from quail_native.models import kernels


@pytest.fixture
def fresh_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Kernels built (or refused) from scratch into an empty cache directory; the process's own afterwards."""
    monkeypatch.setenv("QUAIL_HOME", str(tmp_path))
    kernels._library.cache_clear()
    yield tmp_path
    kernels._library.cache_clear()


def reference_gelu_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = gate.double()
    return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * up.double()


def projection(rows: int, width: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gate and up as the two halves of one [rows, 2 width] projection, with extreme values mixed in."""
    generator = torch.Generator().manual_seed(seed)
    both = torch.randn(rows, 2 * width, generator=generator) * 4
    if rows and width:
        both.view(-1)[:: 7] = torch.tensor([0.0, 1e-30, -1e-30, 90.0, -90.0, 1e6, -1e6]).repeat(
            both.numel() // 49 + 1)[: both.view(-1)[:: 7].numel()]
    gate, up = both.to(dtype).chunk(2, dim=-1)
    return gate, up


def test_a_machine_with_a_c_compiler_builds_the_fused_kernels(fresh_build: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine")
    state = kernels.status()
    assert state.fused, state.detail
    built = list((fresh_build / "kernels").iterdir())
    assert [p.suffix for p in built] == [".so"]  # the library, no build leftovers


@pytest.mark.parametrize(("rows", "width"), [(1, 1), (3, 255), (7, 256), (64, 2048), (257, 700), (0, 16)])
def test_fused_gelu_times_up_matches_float64_in_fp32(rows: int, width: int) -> None:
    gate, up = projection(rows, width, torch.float32, rows * 1000 + width)
    with torch.inference_mode():
        got = kernels.gelu_tanh_times(gate, up)
    want = reference_gelu_times(gate, up)
    assert got.shape == gate.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize(("rows", "width"), [(1, 1), (3, 255), (64, 2048), (257, 700)])
def test_fused_gelu_times_up_in_bf16_rounds_as_torch_does(rows: int, width: int) -> None:
    gate, up = projection(rows, width, torch.bfloat16, rows + width)
    with torch.inference_mode():
        got = kernels.gelu_tanh_times(gate, up)
        eager = kernels.gelu_tanh_times_eager(gate, up)
    assert got.dtype == torch.bfloat16
    # Both round GELU to bf16, then the product: equal but where fp32 GELUs straddle a rounding boundary
    # (or where torch's σ is a denormal that the kernel flushes to 0).
    differing = (got.float() - eager.float()).abs() > 1e-30
    assert differing.float().mean() <= 0.002
    ulp = eager.float().abs().clamp_min(1e-30) * 2.0 ** -7
    assert bool(((got.float() - eager.float()).abs() <= 2 * ulp + 1e-30).all())


def test_layouts_the_kernel_does_not_read_take_the_eager_path() -> None:
    generator = torch.Generator().manual_seed(3)
    cases = [torch.randn(6, 10, generator=generator).to(torch.float16), torch.randn(6, 10, generator=generator).T,
             torch.randn(2, 3, 10, generator=generator), torch.randn(10, generator=generator)]
    with torch.inference_mode():
        for gate in cases:
            up = torch.randn(gate.shape, generator=generator).to(gate.dtype)
            torch.testing.assert_close(kernels.gelu_tanh_times(gate, up).double(), reference_gelu_times(gate, up),
                                       rtol=1e-2 if gate.dtype == torch.float16 else 2e-6, atol=1e-3)


def test_without_a_compiler_every_call_is_eager_and_status_says_why(fresh_build: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-quail")
    state = kernels.status()
    assert not state.fused and "no C compiler" in state.detail
    gate, up = projection(5, 40, torch.float32, 1)
    torch.testing.assert_close(kernels.gelu_tanh_times(gate, up).double(), reference_gelu_times(gate, up),
                               rtol=2e-6, atol=1e-6)


def test_a_build_that_fails_is_reported_and_leaves_nothing_behind(fresh_build: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    failing = fresh_build / "failing-cc"
    failing.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'cc1: error: broken' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    state = kernels.status()
    assert not state.fused and "broken" in state.detail
    assert list((fresh_build / "kernels").iterdir()) == []


def test_quail_kernels_eager_turns_them_off(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUAIL_KERNELS", "eager")
    assert kernels.status() == kernels.KernelStatus(False, "eager: QUAIL_KERNELS=eager")


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
                       residual: torch.Tensor | None) -> torch.Tensor:
    wide = x.double()
    normed = wide / torch.sqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    scaled = normed * ((1.0 + weight.double()) if gemma else weight.double())
    return scaled if residual is None else residual.double() + scaled


def norm_inputs(shape: tuple[int, ...], dtype: torch.dtype, heads_of_wider: bool,
                seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (optionally the first heads of a wider [tokens, width] projection, as q is), a weight, a residual."""
    generator = torch.Generator().manual_seed(seed)
    width = shape[-1]
    if heads_of_wider:
        tokens, heads, _ = shape
        wider = torch.randn(tokens, (heads + 2) * width, generator=generator) * 3
        x = wider.to(dtype)[:, : heads * width].reshape(tokens, heads, width)
    else:
        x = (torch.randn(shape, generator=generator) * 3).to(dtype)
    weight = (torch.randn(width, generator=generator) * 0.3).to(dtype)
    residual = torch.randn(shape, generator=generator).to(dtype)
    return x, weight, residual


NORM_CASES = [((5, 640), False), ((1, 7), False), ((33, 4, 256), True), ((9, 1, 256), True), ((0, 640), False)]


@pytest.mark.parametrize(("shape", "heads_of_wider"), NORM_CASES)
@pytest.mark.parametrize("gemma", [True, False])
@pytest.mark.parametrize("with_residual", [False, True])
def test_fused_rms_norm_matches_float64_in_fp32(shape, heads_of_wider, gemma, with_residual) -> None:
    x, weight, residual = norm_inputs(shape, torch.float32, heads_of_wider, len(shape) * 100 + shape[-1])
    residual = residual if with_residual else None
    with torch.inference_mode():
        got = kernels.rms_norm(x, weight, 1e-6, gemma, residual)
    assert got.shape == x.shape and got.dtype == torch.float32 and got.is_contiguous()
    torch.testing.assert_close(got.double(), reference_rms_norm(x, weight, 1e-6, gemma, residual), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize(("shape", "heads_of_wider"), NORM_CASES)
@pytest.mark.parametrize("gemma", [True, False])
@pytest.mark.parametrize("with_residual", [False, True])
def test_fused_rms_norm_in_bf16_rounds_as_torch_does(shape, heads_of_wider, gemma, with_residual) -> None:
    x, weight, residual = norm_inputs(shape, torch.bfloat16, heads_of_wider, shape[-1] + 7)
    residual = residual if with_residual else None
    with torch.inference_mode():
        got = kernels.rms_norm(x, weight, 1e-6, gemma, residual)
        eager = kernels.rms_norm_eager(x, weight, 1e-6, gemma, residual)
    assert got.dtype == torch.bfloat16
    # Same roundings in the same order; the fp32 sums of squares may differ in their last bits.
    gap = (got.float() - eager.float()).abs()
    assert (gap > 0).float().mean().item() <= 0.01 if gap.numel() else True
    assert bool((gap <= eager.float().abs() * 2.0 ** -7 + 2.0 ** -7).all())


def test_norm_layouts_the_kernel_does_not_read_take_the_eager_path() -> None:
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(6, generator=generator)
    cases = [(torch.randn(6, 5, generator=generator).T, None),  # rows not contiguous
             (torch.randn(2, 3, 4, 6, generator=generator), None),  # 4-D
             (torch.randn(5, 6, generator=generator), torch.randn(6, 5, generator=generator).T),  # strided residual
             (torch.randn(5, 6, generator=generator).to(torch.float16), None)]
    with torch.inference_mode():
        for x, residual in cases:
            w = weight.to(x.dtype)
            got = kernels.rms_norm(x, w, 1e-6, True, residual)
            torch.testing.assert_close(got.double(), reference_rms_norm(x, w, 1e-6, True, residual),
                                       rtol=1e-2 if x.dtype == torch.float16 else 1e-5, atol=1e-2)


def reference_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, cos: torch.Tensor,
                        signed_sin: torch.Tensor) -> torch.Tensor:
    normed = reference_rms_norm(x, weight, eps, gemma, None)
    half = x.shape[-1] // 2
    swapped = torch.cat((normed[..., half:], normed[..., :half]), dim=-1)
    return normed * cos.double()[:, None] + swapped * signed_sin.double()[:, None]


def tables(tokens: int, width: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(tokens, dtype=torch.float64)[:, None] * (1e-4 ** (torch.arange(width // 2) / (width // 2)))
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), -1).to(dtype), torch.cat((-sin, sin), -1).to(dtype)


@pytest.mark.parametrize(("shape", "heads_of_wider"), [((33, 4, 256), True), ((9, 1, 256), True), ((5, 2, 8), False),
                                                       ((0, 4, 256), True)])
@pytest.mark.parametrize("gemma", [True, False])
def test_fused_norm_and_rope_match_float64_in_fp32(shape, heads_of_wider, gemma) -> None:
    x, weight, _ = norm_inputs(shape, torch.float32, heads_of_wider, shape[0] + shape[1])
    cos, sin = tables(shape[0], shape[2], torch.float32)
    with torch.inference_mode():
        got = kernels.rms_norm_rope(x, weight, 1e-6, gemma, cos, sin)
    assert got.shape == x.shape and got.is_contiguous()
    torch.testing.assert_close(got.double(), reference_norm_rope(x, weight, 1e-6, gemma, cos, sin), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("gemma", [True, False])
def test_fused_norm_and_rope_in_bf16_round_as_torch_does(gemma) -> None:
    x, weight, _ = norm_inputs((65, 4, 256), torch.bfloat16, True, 11)
    cos, sin = tables(65, 256, torch.bfloat16)
    with torch.inference_mode():
        got = kernels.rms_norm_rope(x, weight, 1e-6, gemma, cos, sin)
        eager = kernels.rotate(kernels.rms_norm_eager(x, weight, 1e-6, gemma), cos[:, None], sin[:, None])
    gap = (got.float() - eager.float()).abs()
    assert (gap > 0).float().mean().item() <= 0.01
    assert bool((gap <= eager.float().abs() * 2.0 ** -6 + 2.0 ** -7).all())


@pytest.mark.parametrize("gemma", [True, False])
@pytest.mark.parametrize("scale", [256 ** -0.5, 128 ** -0.5])
def test_a_query_scale_multiplies_the_normed_and_rotated_heads_on_both_paths(gemma, scale, monkeypatch) -> None:
    """Attention folds its score scale into the queries here; fused and eager both carry it."""
    x, weight, _ = norm_inputs((17, 4, 256), torch.float32, True, 5)
    cos, sin = tables(17, 256, torch.float32)
    want = reference_norm_rope(x, weight, 1e-6, gemma, cos, sin) * scale
    with torch.inference_mode():
        fused = kernels.rms_norm_rope(x, weight, 1e-6, gemma, cos, sin, scale)
        monkeypatch.setattr(kernels, "_kernel", lambda *args: None)
        eager = kernels.rms_norm_rope(x, weight, 1e-6, gemma, cos, sin, scale)
    for got in (fused, eager):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_a_power_of_two_query_scale_changes_no_bit_of_bf16_heads() -> None:
    """Gemma's 1/16 is exact: the scaled heads are the unscaled ones times 1/16, bit for bit."""
    x, weight, _ = norm_inputs((33, 4, 256), torch.bfloat16, True, 3)
    cos, sin = tables(33, 256, torch.bfloat16)
    with torch.inference_mode():
        plain = kernels.rms_norm_rope(x, weight, 1e-6, True, cos, sin)
        scaled = kernels.rms_norm_rope(x, weight, 1e-6, True, cos, sin, 1 / 16)
    assert torch.equal(scaled, plain / 16)


def test_norm_and_rope_the_kernel_does_not_read_take_the_eager_path() -> None:
    x, weight, _ = norm_inputs((6, 2, 8), torch.float32, False, 2)
    cos, sin = tables(6, 8, torch.float32)
    want = reference_norm_rope(x, weight, 1e-6, True, cos, sin)
    with torch.inference_mode():
        for heads, c, s in [(x.transpose(0, 1).contiguous().transpose(0, 1), cos, sin),  # heads not rows
                            (x, cos.T.contiguous().T, sin),  # a strided table
                            (x, cos.to(torch.float64), sin)]:  # a table of another dtype
            torch.testing.assert_close(kernels.rms_norm_rope(heads, weight, 1e-6, True, c, s).double(), want,
                                       rtol=1e-5, atol=1e-5)
