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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    return "weights prepacked for oneDNN" if reason is None else f"F.linear ({reason})"


class Projection:
    """`x @ weightᵀ (+ bias)` for one weight: through its prepacked copy where oneDNN can take it, else `F.linear`.

    The plain weight stays the model's parameter (state dicts, the answer store's weight identity, the
    head); the packed copy is an opaque oneDNN tensor used only here and never leaves the process."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_ROWS_HINT)
                       if why_unpacked(weight.device, weight.dtype) is None else None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
