"""The CPU precision probe's result, remembered per CPU: later processes read it without torch.

`precision="auto"` on a CPU is the faster of fp32 and bf16 by a GEMM probe (`quail_native.precision`).
Probing in every process cost each one a torch import (2 s on a slow machine) even for a query whose
answers were all in the answer store, where nothing is computed; and a probe that fell on a slow moment
of a shared machine could flip the choice, and with it the answer store's model identity, from one
process to the next. So the first probe for a CPU (model name and feature flags), torch version and model
shape is written to `$QUAIL_HOME/precision/`, and every later process on that CPU takes its choice from
there. Delete the file to measure again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from quail.catalog.locations import quail_cache_home
from quail_native.machine import cpu_features
from quail_native.precision_rule import PrecisionName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeRecord:
    """What one probe measured (FLOP/s of the model's MLP projection in each dtype) and chose."""

    precision: PrecisionName
    bf16_flops: float
    fp32_flops: float
    measured_on: str
    """The UTC date of the probe."""

    def reason(self, remembered_in: Path | None) -> str:
        """The report's remark on the choice."""
        where = f"; remembered in {remembered_in}" if remembered_in is not None else ""
        return (f"{self.precision} (auto: a GEMM probe on this CPU measured bf16 {self.bf16_flops / 1e9:.3g} vs "
                f"fp32 {self.fp32_flops / 1e9:.3g} GFLOP/s on {self.measured_on}{where})")


def record_path(hidden: int, width: int) -> Path:
    """Where the probe of a [hidden × width] projection on this CPU, with this torch, is remembered."""
    key = "\0".join((cpu_features(), _torch_version(), str(hidden), str(width)))
    return quail_cache_home() / "precision" / f"probe-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def read_record(path: Path) -> ProbeRecord | None:
    """The record at `path`; None when there is none or the file is not one (the probe then runs again)."""
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not _is_record(fields):
        log.warning("ignoring %s: not a precision probe record", path)
        return None
    return ProbeRecord(fields["precision"], float(fields["bf16_flops"]), float(fields["fp32_flops"]),
                       fields["measured_on"])


def write_record(path: Path, record: ProbeRecord) -> None:
    """Written whole or not at all: a reader never sees half a file. A cache that cannot be written only
    costs the next process a probe of its own, so it is logged, not raised."""
    temporary: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".probe-", suffix=".tmp",
                                         delete=False) as file:
            temporary = file.name
            json.dump(asdict(record), file)
        os.replace(temporary, path)
    except OSError as error:
        log.warning("could not remember the precision probe in %s: %s", path, error)
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _is_record(fields: object) -> bool:
    if not isinstance(fields, dict) or fields.get("precision") not in ("fp32", "bf16"):
        return False
    rates = (fields.get("bf16_flops"), fields.get("fp32_flops"))
    return (all(isinstance(r, int | float) and r > 0 for r in rates)
            and isinstance(fields.get("measured_on"), str))


def _torch_version() -> str:
    """torch's version without importing it (seconds): a new torch may multiply at other rates."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"
