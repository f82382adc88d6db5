"""What this machine's CPU is, read without torch: the key for work done once per CPU.

Code built with `-march=native` on one CPU may not run on another, and a GEMM rate measured on one says
nothing of another; both are cached under this description (the fused kernels' build, the precision
probe's record).
"""

from __future__ import annotations

import os
from pathlib import Path


def cpu_features() -> str:
    """The CPU's model name and feature flags (`/proc/cpuinfo`), else the machine type."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(wanted))
