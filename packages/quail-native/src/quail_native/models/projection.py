"""A linear projection whose weight is laid out once for the CPU's GEMM, not on every call.

`F.linear` on a CPU hands the weight to its GEMM in PyTorch's row-major layout, and the GEMM repacks
it into its own blocked layout on every call: each pass re-reads and rewrites all ~100M weights of
the model before multiplying. oneDNN (bundled with PyTorch) can take a weight packed once ahead of
time; the model's projections then skip that work. Measured on a 2-core AVX-512 CPU: the four
projection shapes of Gemma 3 270M at 1,439 rows 0.96× (bf16) and 0.81× (fp32) of `F.linear`'s time,
at 7 rows 0.62× and 0.23×; whole bf16 passes 0.89–0.94×, bit-identical to `F.linear` in bf16 there and
within 2e-6 relative in fp32. Where oneDNN multiplies in AMX tiles (Sapphire Rapids) the packed and unpacked
calls may sum in another order: a bf16 output near a rounding boundary then lands one bf16 step away.
These are the ops PyTorch's own compiler emits for CPU linears
(`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`). Where they are missing or do not
fit — not a CPU, no oneDNN, bf16 on a CPU oneDNN has no bf16 path for, another dtype — the weight
stays as it is and `F.linear` runs.

One row — a decode step of one sequence, which reads every weight for a single product — goes to Quail's own
bf16 kernel where the CPU has AVX-512 BF16 (`kernels.one_row_projection`): oneDNN's one-row GEMM read Gemma 3
270M's layer weights at ~0.8 of the memory's rate, the kernel at its full rate (batch-1 decoding 0.64 → 0.70 of
the weight-bandwidth limit with the greedy head's kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quail_native.models import kernels

PACKED_ROWS_HINT = 1024
"""The row count oneDNN is told to expect (a pass's chunk of tokens); any count runs correctly."""


def why_unpacked(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when oneDNN can take weights of this device and dtype prepacked here, else why not."""
    if device.type != "cpu":
        return f"not on a CPU ({device.type})"
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch has no oneDNN"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "oneDNN has no bf16 path on this CPU"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"oneDNN prepacking is not used for {dtype}"
    return None


def describe(device: torch.device, dtype: torch.dtype) -> str:
    """For the query report: how the model's projections multiply here."""
    reason = why_unpacked(device, dtype)
    described = "weights prepacked for oneDNN" if reason is None else f"F.linear ({reason})"
    one_row = kernels.one_row_status(dtype) if device.type == "cpu" else None
    return described if one_row is None else f"{described}; {one_row}"


class Projection:
    """`x @ weightᵀ (+ bias)` for one weight: through its prepacked copy where oneDNN can take it, else `F.linear`.

    The plain weight stays the model's parameter (state dicts, the answer store's weight identity, the
    head); the packed copy is an opaque oneDNN tensor used only here and never leaves the process."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_ROWS_HINT)
                       if why_unpacked(weight.device, weight.dtype) is None else None)
        self.one_row = kernels.one_row_projection(weight.detach(), None if bias is None else bias.detach())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_row is not None and x.shape[0] == 1:
            out = self.one_row(x)
            if out is not None:
                return out
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
