"""The precision rules, without torch: the choices that need no measurement, and the margin by which a
measured bf16 must win. Planning reads them.

`fp32` and `bf16` are taken as asked and `auto` on CUDA is bf16; only `auto` on a CPU is measured
(`quail_native.precision`'s GEMM probe), so only it needs torch — once per CPU (`precision_record`);
the rule that turns the probe's rates into a choice is here, so a remembered probe is read without torch.
"""

from __future__ import annotations

from typing import Literal

from quail.extend import Precision

PrecisionName = Literal["fp32", "bf16"]

BF16_MARGIN = 1.15
"""bf16 must beat fp32 by this factor to be chosen: its rounding is only worth a clear speed-up."""


def unmeasured_precision(requested: Precision, device_type: str) -> tuple[PrecisionName, str] | None:
    """(precision, why) when `requested` on a device of this type decides without a probe, else None."""
    if requested == "fp32":
        return "fp32", "fp32 as configured"
    if requested == "bf16":
        return "bf16", "bf16 as configured"
    if device_type == "cuda":
        return "bf16", "bf16 (auto on CUDA)"
    return None


def faster_precision(bf16_flops: float, fp32_flops: float) -> PrecisionName:
    """What `auto` on a CPU computes in, given the probe's rates: bf16 only when clearly faster."""
    return "bf16" if bf16_flops >= BF16_MARGIN * fp32_flops else "fp32"
