"""Which floating-point precision the native engine computes in.

`fp32` and `bf16` are taken as asked. `auto` is bf16 on CUDA; on a CPU it is whichever a GEMM probe
measures faster on the model's own matrix shapes — CPUs of one machine image differ: with bf16 units
bf16 runs about twice as fast as fp32, without them hundreds of times slower. The first boot on a CPU
probes; later processes take what it measured from `precision_record`. The choice, with the measured
rates, is said in the query report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

import torch

from quail.extend import Precision
from quail_native.models.projection import Projection
from quail_native.precision_record import ProbeRecord, recall, record_path, remember
from quail_native.precision_rule import PrecisionName, unmeasured_precision

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
    """The dtype to compute in and why. `auto` on a CPU takes the probe remembered for this CPU, else
    probes now and remembers (`precision_record`); a `rate` given (a test's) decides alone, remembered nowhere."""
    unmeasured = unmeasured_precision(requested, device.type)
    if unmeasured is not None:
        name, reason = unmeasured
        return PrecisionChoice(_dtype(name), reason)
    if rate is not None:
        record = probe(rate)
        return PrecisionChoice(_dtype(record.precision), record.reason(None))
    path = record_path(hidden, width)
    record = recall(path)
    if record is None:
        record = remember(path, probe(lambda dtype: gemm_rate(dtype, device, hidden, width)))
    return PrecisionChoice(_dtype(record.precision), record.reason(path))


def probe(rate: Rate) -> ProbeRecord:
    """Both dtypes' rates, measured now (its `precision` is bf16 only when clearly the faster)."""
    fp32, bf16 = rate(torch.float32), rate(torch.bfloat16)
    return ProbeRecord(bf16, fp32, datetime.now(UTC).date().isoformat())


def _dtype(name: PrecisionName) -> torch.dtype:
    return torch.bfloat16 if name == "bf16" else torch.float32


@lru_cache(maxsize=16)
def gemm_rate(dtype: torch.dtype, device: torch.device, hidden: int, width: int) -> float:
    """Best FLOP/s of [PROBE_TOKENS × hidden] @ [hidden × width] — the shape of the model's MLP projection.

    Measured at most once per process and shape (and remembered across processes by `choose_precision`):
    the engine, the answer store's model identity and the bench must all see the same choice."""
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
