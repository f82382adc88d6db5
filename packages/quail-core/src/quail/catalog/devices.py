"""DeviceSpec: memory, peak rates and bandwidth from datasheets, and the built-ins."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DeviceKind = Literal["cpu", "cuda"]
Precision = Literal["fp32", "bf16", "fp8"]

GB = 1e9
TERA = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet numbers of one device; the cost model's only hardware input."""

    name: str
    kind: DeviceKind
    memory_bytes: float
    peak_bf16_flops: float
    peak_fp32_flops: float
    bandwidth_bytes_per_s: float
    peak_fp8_flops: float | None = None
    dollars_per_hour: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("DeviceSpec.name must not be empty")
        for label in ("memory_bytes", "peak_bf16_flops", "peak_fp32_flops", "bandwidth_bytes_per_s"):
            if getattr(self, label) <= 0:
                raise ValueError(f"DeviceSpec {self.name!r}: {label} must be positive")

    def peak_flops(self, precision: Precision) -> float:
        """Peak FLOP/s at a precision; fp8 falls back to bf16 where the device has no fp8 units."""
        if precision == "fp8":
            return self.peak_fp8_flops or self.peak_bf16_flops
        return self.peak_bf16_flops if precision == "bf16" else self.peak_fp32_flops


def _gpu(name: str, memory_gb: float, bandwidth_tb: float, bf16_tf: float, fp32_tf: float,
         fp8_tf: float | None, dollars: float, description: str) -> DeviceSpec:
    return DeviceSpec(
        name=name, kind="cuda", memory_bytes=memory_gb * GB, peak_bf16_flops=bf16_tf * TERA,
        peak_fp32_flops=fp32_tf * TERA, bandwidth_bytes_per_s=bandwidth_tb * TERA,
        peak_fp8_flops=None if fp8_tf is None else fp8_tf * TERA, dollars_per_hour=dollars,
        description=description,
    )


# Dense tensor-core peaks (no sparsity) and HBM/GDDR bandwidth from the vendors' datasheets.
DATASHEET_GPUS: tuple[DeviceSpec, ...] = (
    _gpu("h100-sxm", 80, 3.35, 989, 67, 1979, 3.0, "NVIDIA H100 SXM5 80 GB"),
    _gpu("h200", 141, 4.8, 989, 67, 1979, 3.7, "NVIDIA H200 SXM 141 GB"),
    _gpu("a100-80gb", 80, 2.039, 312, 19.5, None, 1.8, "NVIDIA A100 SXM4 80 GB"),
    _gpu("l40s", 48, 0.864, 362, 91.6, 733, 1.0, "NVIDIA L40S 48 GB"),
)

# A dual-channel DDR4/DDR5 figure: CPUs publish no single bandwidth, so this one is configured.
DEFAULT_CPU_BANDWIDTH = 40 * GB


def _cpu_flags_and_mhz(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[frozenset[str], float]:
    """Flags and clock of the first processor listed (its block ends at the first blank line)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset(), 2000.0
    flags: frozenset[str] = frozenset()
    mhz = 2000.0
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = frozenset(value.split())
        elif key.strip() == "cpu MHz":
            mhz = float(value)
    return flags, mhz


def _flops_per_cycle(flags: frozenset[str]) -> tuple[int, int]:
    """(fp32, bf16) FLOPs per core per cycle from the vector units the flags announce."""
    if "avx512f" in flags:
        fp32 = 64  # two 16-lane FMA units
    elif "avx2" in flags and "fma" in flags:
        fp32 = 32
    else:
        fp32 = 8
    if "amx_bf16" in flags:
        bf16 = 1024
    elif "avx512_bf16" in flags:
        bf16 = 2 * fp32
    else:
        bf16 = fp32
    return fp32, bf16


def cpu_device(*, peak_bf16_flops: float | None = None, peak_fp32_flops: float | None = None,
               bandwidth_bytes_per_s: float | None = None) -> DeviceSpec:
    """This machine's CPU: peaks from core count × clock × vector width, unless configured."""
    flags, mhz = _cpu_flags_and_mhz()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    fp32_per_cycle, bf16_per_cycle = _flops_per_cycle(flags)
    hz = mhz * 1e6
    memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return DeviceSpec(
        name="cpu", kind="cpu", memory_bytes=memory,
        peak_bf16_flops=peak_bf16_flops or cores * hz * bf16_per_cycle,
        peak_fp32_flops=peak_fp32_flops or cores * hz * fp32_per_cycle,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s or DEFAULT_CPU_BANDWIDTH,
        description=f"this machine's CPU ({cores} cores)",
    )


BUILT_IN_DEVICES: tuple[DeviceSpec, ...] = (cpu_device(), *DATASHEET_GPUS)
