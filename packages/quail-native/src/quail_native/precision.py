"""Which floating-point precision the native engine computes in.

`fp32` and `bf16` are taken as asked. `auto` is bf16 on CUDA; on a CPU it is whichever a GEMM probe
at boot measures faster on the model's own matrix shapes — CPUs of one machine image differ: with
bf16 units bf16 runs about twice as fast as fp32, without them hundreds of times slower — and the
choice, with the measured rates, is said in the query report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from quail.config import Precision
from quail_native.models.projection import Projection
from quail_native.precision_rule import unmeasured_precision

BF16_MARGIN = 1.15
"""bf16 must beat fp32 by this factor to be chosen: its rounding is only worth a clear speed-up."""
PROBE_TOKENS = 256
PROBE_REPEATS = 3

Rate = Callable[[torch.dtype], float]
"""FLOP/s of a GEMM in a dtype."""


@dataclass(frozen=True)
class PrecisionChoice:
    dtype: torch.dtype
    reason: str


def choose_precision(requested: Precision, device: torch.device, hidden: int, width: int,
                     rate: Rate | None = None) -> PrecisionChoice:
    """The dtype to compute in and why; `rate` measures a GEMM (the probe below unless a test gives one)."""
    unmeasured = unmeasured_precision(requested, device.type)
    if unmeasured is not None:
        name, reason = unmeasured
        return PrecisionChoice(torch.bfloat16 if name == "bf16" else torch.float32, reason)
    measure = rate or (lambda dtype: gemm_rate(dtype, device, hidden, width))
    fp32, bf16 = measure(torch.float32), measure(torch.bfloat16)
    chosen = torch.bfloat16 if bf16 >= BF16_MARGIN * fp32 else torch.float32
    name = "bf16" if chosen == torch.bfloat16 else "fp32"
    return PrecisionChoice(chosen, f"{name} (auto: a GEMM probe at boot measured bf16 {bf16 / 1e9:.3g} vs fp32 "
                                   f"{fp32 / 1e9:.3g} GFLOP/s on this CPU)")


@lru_cache(maxsize=16)
def gemm_rate(dtype: torch.dtype, device: torch.device, hidden: int, width: int) -> float:
    """Best FLOP/s of [PROBE_TOKENS × hidden] @ [hidden × width] — the shape of the model's MLP projection.

    Measured once per process and shape: the engine, the answer store's model identity and the bench must
    all see the same choice."""
    return projection_rate(dtype, device, PROBE_TOKENS, hidden, width, PROBE_REPEATS)


def projection_rate(dtype: torch.dtype, device: torch.device, rows: int, inputs: int, outputs: int,
                    repeats: int) -> float:
    """Best FLOP/s, measured now, of [rows × inputs] @ [inputs × outputs] multiplied the way the model
    multiplies it (`Projection`: prepacked where oneDNN takes the dtype)."""
    x = torch.randn(rows, inputs, device=device).to(dtype)
    project = Projection(torch.randn(outputs, inputs, device=device).to(dtype))
    project(x)  # warm-up: the first call of a dtype pays for kernel selection
    best = 0.0
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        project(x)
        synchronize(device)
        best = max(best, 2.0 * rows * inputs * outputs / max(time.perf_counter() - started, 1e-9))
    return best


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA GEMM returns before it has run), so a timing covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
