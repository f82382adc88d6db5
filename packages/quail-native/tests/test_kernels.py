"""The fused CPU kernels against float64 references and torch's eager ops; the eager fallback when
they cannot be built."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
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
    built = sorted((fresh_build / "kernels").iterdir())
    assert [p.suffix for p in built] == [".so", ".sha256"]  # the library and its digest, no build leftovers


def test_a_cached_library_cut_short_is_built_again(fresh_build: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine")
    assert kernels.status().fused
    [library] = (fresh_build / "kernels").glob("*.so")
    cut = library.with_name("cut.so")  # a new file moved over it: this process has the old one mapped
    cut.write_bytes(library.read_bytes()[:1000])
    cut.replace(library)
    probe = "from quail_native.models import kernels; state = kernels.status(); print(state.fused, state.detail)"
    # a new process: this one has the library loaded already, and the loader would hand that back
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "QUAIL_HOME": str(fresh_build)})
    assert run.stdout.startswith("True"), run.stdout + run.stderr
    assert library.stat().st_size > 1000


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


def segment_operands(rows: int, context: int, heads: int, kv_heads: int, dim: int, window: int | None,
                     asked: list[int] | None, seed: int, riders: tuple[tuple[int, int], ...] = (),
                     arena: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A segment as a pass hands it over: an arena of kv heads read at scattered slots (a new one, or
    `arena`), the segment's own rows of k and v (v cut from a wider projection, as the model's are), queries
    already scaled, and a causal mask (with a sliding window when given). `asked`: only those rows ask (q of
    those rows, "queries" names them). `riders`: (rows, lent) of items at the end of the segment, each causal
    on its own and seeing the first `lent` rows of the first item (a borrower computing in its lender's pass),
    blind to the rows between."""
    generator = torch.Generator().manual_seed(seed)
    if arena is None:
        arena = tuple(torch.randn(kv_heads, context + 40, dim, generator=generator).to(torch.bfloat16) for _ in "kv")
    slots = torch.randperm(arena[0].shape[1], generator=generator)[:context]
    keys = torch.randn(rows, kv_heads, dim, generator=generator).to(torch.bfloat16)
    values = torch.randn(rows, 2 * kv_heads * dim, generator=generator).to(torch.bfloat16)[:, :kv_heads * dim]
    q = (torch.randn(rows, heads, dim, generator=generator) * dim ** -0.5).to(torch.bfloat16)
    own = torch.ones(rows, rows, dtype=torch.bool).tril()
    start = rows - sum(length for length, _ in riders)
    for length, lent in riders:
        own[start:start + length, :start] = False
        own[start:start + length, :lent] = True
        own[start + length:, start:start + length] = False
        start += length
    mask = torch.cat((torch.ones(rows, context, dtype=torch.bool), own), 1)
    if window is not None:
        position = torch.arange(context + rows)
        mask &= (position[context:, None] - position[None, :]) < window
    operands = {"q": q, "context_keys": arena[0], "context_values": arena[1], "slots": slots, "keys": keys,
                "values": values.reshape(rows, kv_heads, dim), "mask": mask}
    if asked is not None:
        operands |= {"q": q[asked], "queries": torch.tensor(asked, dtype=torch.long)}
    return operands


def reference_attention(operands: dict[str, torch.Tensor]) -> torch.Tensor:
    """Softmax attention in float64, head by head, each query head on its group's kv head."""
    slots = operands["slots"]
    keys = torch.cat((operands["context_keys"][:, slots].transpose(0, 1), operands["keys"])).double()
    values = torch.cat((operands["context_values"][:, slots].transpose(0, 1), operands["values"])).double()
    q, mask = operands["q"].double(), operands["mask"]
    if "queries" in operands:
        mask = mask[operands["queries"]]
    group = q.shape[1] // keys.shape[1]
    heads = [(q[:, h] @ keys[:, h // group].T).masked_fill(~mask, float("-inf")).softmax(-1) @ values[:, h // group]
             for h in range(q.shape[1])]
    return torch.stack(heads, dim=1)


def fused_attention(operands: dict[str, torch.Tensor]) -> tuple[bool, torch.Tensor]:
    """One segment's operands through the kernel, as a pass of that one segment."""
    shapes = torch.tensor([[operands["keys"].shape[0], operands["slots"].numel()]])
    return fused_pass(operands, shapes, operands["mask"].flatten())


def fused_pass(operands: dict[str, torch.Tensor], shapes: torch.Tensor, masks: torch.Tensor
               ) -> tuple[bool, torch.Tensor]:
    out = torch.full_like(operands["q"], float("nan"))
    with torch.inference_mode():
        ran = kernels.attention(operands["q"], out, operands.get("queries"),
                                (operands["context_keys"], operands["context_values"]), operands["keys"],
                                operands["values"], kernels.flat_segments(shapes, operands["slots"]), masks)
    return ran, out


def fused_here(dtype: torch.dtype) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not kernels.attention_status(dtype).startswith("fused"),
                              reason=f"attention here: {kernels.attention_status(dtype)}")


needs_fused_attention = fused_here(torch.bfloat16)


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=needs_fused_attention),
                                   pytest.param(torch.float32, marks=fused_here(torch.float32))])
@pytest.mark.parametrize(("rows", "context", "heads", "kv_heads", "dim", "window", "asked", "riders"), [
    (1, 0, 4, 1, 256, None, None, ()),  # one token, nothing before it
    (5, 3, 4, 1, 256, None, None, ()),
    (85, 4, 4, 1, 256, None, None, ()),  # a review over the preamble (the bench's segments)
    (20, 437, 4, 1, 256, None, None, ()),  # a question tail over a long document
    (300, 0, 4, 1, 256, 100, None, ()),  # a sliding window: whole blocks before it are skipped
    (37, 101, 4, 2, 32, None, None, ()),  # grouped query heads, 32-wide heads (the tiny test models)
    (40, 17, 2, 1, 64, None, None, ()),  # fewer query heads than the kernel computes together
    (64, 300, 8, 2, 96, 50, None, ()),
    (33, 9, 6, 2, 64, None, None, ()),  # groups of three heads
    (29, 12, 6, 1, 64, 20, None, ()),  # a group of six: one step of four, then two
    (1, 0, 3, 1, 32, None, None, ()),
    (70, 40, 4, 1, 256, None, [5, 30, 69], ()),  # only the read-out rows ask (the last layer)
    (300, 4, 4, 1, 256, None, None, ((20, 190), (20, 33))),  # borrowers riding behind their lender's 260 rows
    (200, 50, 4, 1, 256, 64, None, ((17, 150), (9, 1))),  # … on sliding layers too
    (90, 8, 6, 2, 64, None, [10, 70, 89], ((30, 40),)),  # … read-out rows of a rider
])
def test_fused_attention_matches_float64_within_its_rounding(rows, context, heads, kv_heads, dim, window, asked,
                                                             riders, dtype) -> None:
    operands = segment_operands(rows, context, heads, kv_heads, dim, window, asked, rows + context + dim, riders)
    operands = {name: t.to(dtype) if t.is_floating_point() else t for name, t in operands.items()}
    ran, got = fused_attention(operands)
    assert ran and got.dtype == dtype
    want = reference_attention(operands)
    if dtype == torch.bfloat16:
        # Two bf16 roundings: the weights (relative 2^-9 each, so at most 2^-9 max|v| in the sum) and the output.
        bound = 2.0 ** -9 * operands["values"].double().abs().max() + 2.0 ** -8 * want.abs() + 1e-6
    else:
        bound = 1e-5 * operands["values"].double().abs().max() + 1e-5 * want.abs()
    assert bool(((got.double() - want).abs() <= bound).all())


PASS_SEGMENTS = [  # (rows, context, window, riders): the kinds of segments one pass mixes
    (85, 4, None, ()), (20, 437, None, ()), (1, 0, None, ()), (300, 0, 100, ()), (3, 2, None, ()),
    (120, 60, 64, ((30, 50),)), (7, 437, None, ()), (16, 16, None, ())]


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=needs_fused_attention),
                                   pytest.param(torch.float32, marks=fused_here(torch.float32))])
@pytest.mark.parametrize("asked", [None, [0, 84, 85, 104, 105, 106, 405, 406, 409, 500, 528, 529, 535, 536, 551]])
def test_one_call_attends_every_segment_of_a_pass_as_each_alone(dtype, asked) -> None:
    """Segments of every kind, over one arena, in one call (with only some rows of several segments asking,
    as on the last layer): each row gets what its segment alone gives in float64."""
    generator = torch.Generator().manual_seed(5)
    arena = tuple(torch.randn(1, 600, 256, generator=generator).to(dtype) for _ in "kv")
    parts = [segment_operands(rows, context, 4, 1, 256, window, None, 11 + index, riders, arena)
             for index, (rows, context, window, riders) in enumerate(PASS_SEGMENTS)]
    parts = [{name: t.to(dtype) if t.is_floating_point() else t for name, t in part.items()} for part in parts]
    values = torch.cat([part["values"] for part in parts])
    whole = {"q": torch.cat([part["q"] for part in parts]), "context_keys": arena[0], "context_values": arena[1],
             "slots": torch.cat([part["slots"] for part in parts]), "keys": torch.cat([part["keys"] for part in parts]),
             "values": torch.cat((values, values), dim=2)[:, 0, :256].view(-1, 1, 256)}  # rows further apart
    want = torch.cat([reference_attention(part) for part in parts])
    if asked is not None:
        whole |= {"q": whole["q"][asked], "queries": torch.tensor(asked)}
        want = want[asked]
    shapes = torch.tensor([[part["keys"].shape[0], part["slots"].numel()] for part in parts])
    ran, got = fused_pass(whole, shapes, torch.cat([part["mask"].flatten() for part in parts]))
    assert ran
    rounding = 2.0 ** -9 if dtype == torch.bfloat16 else 1e-5
    bound = rounding * values.double().abs().max() + 2 * rounding * want.abs() + 1e-6
    assert bool(((got.double() - want).abs() <= bound).all())


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=needs_fused_attention),
                                   pytest.param(torch.float32, marks=fused_here(torch.float32))])
def test_rows_that_may_attend_to_nothing_get_zeros_and_leave_their_neighbours_alone(dtype) -> None:
    """Blind rows inside a block of rows computed together (the tiles' 16): zeros for them, and every other row
    of the block as the float64 reference gives it."""
    operands = segment_operands(40, 30, 4, 1, 256, None, None, 9)
    operands = {name: t.to(dtype) if t.is_floating_point() else t for name, t in operands.items()}
    blind = [3, 17, 18, 39]
    operands["mask"][blind] = False
    ran, got = fused_attention(operands)
    assert ran
    assert bool((got[blind] == 0).all())
    seeing = [row for row in range(40) if row not in blind]
    want = reference_attention(operands)[seeing]
    rounding = 2.0 ** -9 if dtype == torch.bfloat16 else 1e-5
    bound = rounding * operands["values"].double().abs().max() + 2 * rounding * want.abs() + 1e-6
    assert bool(((got[seeing].double() - want).abs() <= bound).all())


def test_a_pass_whose_shapes_do_not_cover_its_operands_is_left_to_the_caller() -> None:
    """The kernel reads masks, slots and rows where the shapes say: shapes that do not add up to the operands,
    or query rows outside the pass, never reach it."""
    operands = segment_operands(9, 4, 4, 1, 64, None, [2, 8], 4)
    good = torch.tensor([[9, 4]])
    assert fused_pass(operands, good, operands["mask"].flatten())[0] == kernels.attention_status(
        torch.bfloat16).startswith("fused")
    wrong = ([[9, 5]], [[8, 4]], [[4, 4], [4, 0]], [9, 4])
    for shapes in [*map(torch.tensor, wrong), torch.tensor([[9, 0], [4, 4]]).T]:  # the last not contiguous
        ran, out = fused_pass(operands, shapes, operands["mask"].flatten())
        assert not ran and bool(out.isnan().all())
    for queries in ([2, 9], [-1, 3], [2]):
        ran, out = fused_pass(operands | {"queries": torch.tensor(queries)}, good, operands["mask"].flatten())
        assert not ran and bool(out.isnan().all())


@needs_fused_attention
def test_fused_attention_is_closer_to_float64_than_the_gemm_path() -> None:
    """Scores and softmax stay in fp32 inside the kernel; torch's bf16 GEMMs round the scores first."""
    from quail_native.models.transformer import attend

    operands = segment_operands(120, 60, 4, 1, 256, None, None, 7)
    ran, got = fused_attention(operands)
    slots = operands["slots"]
    keys = torch.cat((operands["context_keys"][:, slots], operands["keys"].transpose(0, 1)), dim=1)
    values = torch.cat((operands["context_values"][:, slots], operands["values"].transpose(0, 1)), dim=1)
    with torch.inference_mode():
        gemms = attend(operands["q"].transpose(0, 1), keys, values, operands["mask"]).transpose(0, 1)
    want = reference_attention(operands)
    assert ran
    assert (got.double() - want).abs().mean() < (gemms.double() - want).abs().mean()


def test_attention_the_kernel_does_not_run_is_left_to_the_caller() -> None:
    """fp16 (the kernels are bf16 and fp32), heads not a multiple of 32 wide, or a mask of the wrong width:
    False, and `out` untouched."""
    cases = []
    fp16 = segment_operands(9, 4, 4, 1, 64, None, None, 1)
    cases.append({name: t.half() if t.is_floating_point() else t for name, t in fp16.items()})
    cases.append(segment_operands(9, 4, 4, 1, 48, None, None, 2))
    narrow = segment_operands(9, 4, 4, 1, 64, None, None, 3)
    cases.append({**narrow, "mask": narrow["mask"][:, 1:].contiguous()})
    for operands in cases:
        ran, out = fused_attention(operands)
        assert not ran
        assert bool(out.isnan().all())


def test_a_cpu_with_avx512_bf16_attends_with_the_fused_kernel_and_the_report_says_so() -> None:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    capable = {"avx512_bf16", "avx512bw", "avx512vl"} <= flags and kernels.status().fused
    tiles = {"amx_bf16", "amx_tile"} <= flags  # Linux lends the tiles to any process that asks
    fused = ("fused bf16 kernel (AMX tiles; AVX-512 BF16 for blocks of under 4 rows)" if tiles else
             "fused bf16 kernel (AVX-512 BF16)")
    assert kernels.attention_status(torch.bfloat16) == (fused if capable else (
        "two GEMMs around a softmax (the fused kernel needs AVX-512 BF16: this CPU or its compiler lacks it)"
        if kernels.status().fused else f"two GEMMs around a softmax ({kernels.status().detail})"))
    assert kernels.attention_status(torch.float32) == ("fused fp32 kernel" if kernels.status().fused else
                                                       f"two GEMMs around a softmax ({kernels.status().detail})")


needs_one_row_kernel = pytest.mark.skipif(kernels.one_row_status(torch.bfloat16) is None,
                                          reason="the one-row kernels need AVX-512 BF16 and a built library")


@needs_one_row_kernel
@pytest.mark.parametrize(("rows", "width"), [(1536, 640), (640, 2048), (13, 40), (7, 96), (5, 17), (1, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_one_row_projection_rounds_its_fp32_sum_once_as_f_linear_does(rows, width, with_bias) -> None:
    """fp32 sums of exact bf16 products (in another order than oneDNN's), the bias added in fp32, one rounding:
    within one bf16 step of the float64 product rounded to bf16, and mostly that very value."""
    generator = torch.Generator().manual_seed(rows * width)
    weight = (torch.randn(rows, width, generator=generator) * 0.05).to(torch.bfloat16)
    bias = torch.randn(rows, generator=generator).to(torch.bfloat16) if with_bias else None
    x = torch.randn(1, width, generator=generator).to(torch.bfloat16)
    project = kernels.one_row_projection(weight, bias)
    assert project is not None
    got = project(x)
    assert got is not None and got.shape == (1, rows) and got.dtype == torch.bfloat16
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    gap = (got.double() - exact).abs()
    assert bool((gap <= exact.abs() * 2.0 ** -8 * 1.01 + 1e-6).all())
    assert (got != exact.to(torch.bfloat16)).float().mean().item() <= 0.02


@needs_one_row_kernel
def test_rows_and_layouts_the_one_row_kernel_does_not_take_are_left_to_the_caller() -> None:
    weight = torch.randn(64, 32).to(torch.bfloat16)
    project = kernels.one_row_projection(weight, None)
    assert project is not None
    assert project(torch.randn(2, 32).to(torch.bfloat16)) is None  # two rows: a GEMM
    assert project(torch.randn(1, 32)) is None  # fp32
    assert project(torch.randn(1, 64).to(torch.bfloat16)[:, ::2]) is None  # strided
    assert kernels.one_row_projection(weight.T, None) is None  # not one contiguous block
    assert kernels.one_row_projection(weight.float(), None) is None
    assert kernels.one_row_projection(weight, torch.zeros(63, dtype=torch.bfloat16)) is None
    assert project(torch.randn(1, 31).to(torch.bfloat16)) is None  # a row of another width
    with torch.enable_grad():  # a row autograd follows: F.linear keeps its gradient
        assert project(torch.randn(1, 32).to(torch.bfloat16).requires_grad_()) is None


@needs_one_row_kernel
@pytest.mark.parametrize(("vocabulary", "width", "top"), [(262144, 640, 8), (1001, 64, 8), (9, 17, 9), (50, 32, 1)])
def test_the_head_top_kernel_finds_the_largest_logits_largest_first(vocabulary, width, top) -> None:
    generator = torch.Generator().manual_seed(vocabulary)
    head = (torch.randn(vocabulary, width, generator=generator) * 0.05).to(torch.bfloat16)
    x = torch.randn(1, width, generator=generator).to(torch.bfloat16)
    found = kernels.head_top(x, head, top)
    assert found is not None
    logits = (x.double() @ head.double().T)[0]
    expected = logits.topk(top)
    # fp32 sums may order two logits within their rounding of each other either way: the values found are the
    # largest ones, largest first, each the logit of the id found
    assert found.shape == (top,) and len(set(found.tolist())) == top
    assert torch.allclose(logits[found], expected.values, rtol=1e-5, atol=1e-6)


@needs_one_row_kernel
@pytest.mark.parametrize(("largest", "top", "expected"), [
    ((2047, 2048, 4098), 3, [2047, 2048, 4098]),  # the last row of one thread's share, the first of the next, a tail
    ((4098, 2048, 10), 2, [10, 2048]),  # ties go to the lower ids, wherever they were summed
    ((4098, 4097), 1, [4097]),  # two tail rows
])
def test_equal_logits_go_to_the_lower_id_across_the_threads_shares_and_the_last_rows(largest, top, expected) -> None:
    """4,099 head rows: blocks of four split between the threads, and three rows after the last block."""
    head = torch.full((4099, 64), 0.25, dtype=torch.bfloat16)
    head[list(largest)] = 1.0
    found = kernels.head_top(torch.ones(1, 64, dtype=torch.bfloat16), head, top)
    assert found is not None and found.tolist() == expected


@needs_one_row_kernel
def test_a_row_of_nan_is_left_to_the_caller() -> None:
    head = torch.ones(100, 32, dtype=torch.bfloat16)
    assert kernels.head_top(torch.full((1, 32), float("nan"), dtype=torch.bfloat16), head, 8) is None


@needs_one_row_kernel
def test_the_head_top_kernel_leaves_what_it_does_not_take_to_the_caller() -> None:
    head = torch.randn(100, 32).to(torch.bfloat16)
    assert kernels.head_top(torch.randn(2, 32).to(torch.bfloat16), head, 8) is None  # two rows
    assert kernels.head_top(torch.randn(1, 32).to(torch.bfloat16), head, kernels.HEAD_MAX_TOP + 1) is None
    assert kernels.head_top(torch.randn(1, 32), head.float(), 8) is None  # fp32: the exact head decides


@pytest.mark.skipif(not kernels.status().fused, reason="no kernel library here")
def test_fused_silu_times_up_in_bf16_has_the_bits_of_torchs_two_ops_for_every_input(monkeypatch) -> None:
    """Every bf16 value as a gate (against three values of up), as the two halves of one [rows, 2 width]
    projection; the eager ops are taken away from the kernel's module, so it is the kernel that answers."""
    every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gates = every[~torch.isnan(every)].reshape(-1, 14)  # 65,282 values
    silu = torch.nn.functional.silu
    monkeypatch.setattr(kernels, "F", None)
    for up_value in (1.0, -3.5, 1e-3):
        both = torch.cat([gates, torch.full_like(gates, up_value)], dim=1)
        with torch.no_grad():  # as a forward pass runs
            got = kernels.silu_times(both[:, :14], both[:, 14:])
        want = silu(both[:, :14]).mul_(both[:, 14:])
        same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
        assert bool(same.all()), gates[~same][:8]
