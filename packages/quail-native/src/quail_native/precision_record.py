"""The CPU precision probe's result, remembered per CPU: later processes read it without torch.

`precision="auto"` on a CPU is the faster of fp32 and bf16 by a GEMM probe (`quail_native.precision`).
Probing in every process cost each one a torch import (2 s on a slow machine) even for a query whose
answers were all in the answer store, where nothing is computed; and a probe that fell on a slow moment
of a shared machine could flip the choice, and with it the answer store's model identity, from one
process to the next. So the first probe for a CPU (model name and feature flags), torch version and model
shape is written to `$QUAIL_HOME/precision/` (or `$QUAIL_PRECISION_RECORDS`), and every later process on
that CPU takes its rates from there; the choice is made from the rates when they are read
(`precision_rule.faster_precision`), so a changed rule applies to old records.

The first record written wins: a process that probed at the same time as another takes the other's
record, and a process never changes its mind once it has read or written one, so the precision an
answer is stored under is the precision its engine computes in. Delete the file, while no Quail process
runs, to measure again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from quail.extend import quail_cache_home
from quail_native.machine import cpu_features
from quail_native.precision_rule import PrecisionName, faster_precision

RECORDS_ENVIRONMENT = "QUAIL_PRECISION_RECORDS"
"""A directory for the records instead of `$QUAIL_HOME/precision`."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeRecord:
    """What one probe measured: FLOP/s of the model's MLP projection in each dtype, and when."""

    bf16_flops: float
    fp32_flops: float
    measured_on: str
    """The UTC date of the probe."""

    @property
    def precision(self) -> PrecisionName:
        return faster_precision(self.bf16_flops, self.fp32_flops)

    def reason(self, remembered_in: Path | None) -> str:
        """The report's remark on the choice."""
        where = f"; remembered in {remembered_in}" if remembered_in is not None else ""
        return (f"{self.precision} (auto: a GEMM probe on this CPU measured bf16 {self.bf16_flops / 1e9:.3g} vs "
                f"fp32 {self.fp32_flops / 1e9:.3g} GFLOP/s on {self.measured_on}{where})")


_KNOWN: dict[Path, ProbeRecord] = {}
"""The record each path held when this process first read or wrote it: its choice for the process's life."""


def record_path(hidden: int, width: int) -> Path:
    """Where the probe of a [hidden × width] projection on this CPU, with this torch, is remembered."""
    configured = os.environ.get(RECORDS_ENVIRONMENT, "").strip()
    directory = Path(configured).expanduser() if configured else quail_cache_home() / "precision"
    key = "\0".join((cpu_features(), _torch_version(), str(hidden), str(width)))
    return directory / f"probe-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def recall(path: Path) -> ProbeRecord | None:
    """The record this process holds for `path`, else the one on disk; None when there is none or the file
    is not one (the caller probes and `remember`s)."""
    known = _KNOWN.get(path)
    if known is None:
        known = _read(path)
        if known is not None:
            _KNOWN[path] = known
    return known


def remember(path: Path, record: ProbeRecord) -> ProbeRecord:
    """Writes `record` unless another process wrote one first, and returns the one that holds: this
    process's choice from now on. A file that is not a record is replaced; a directory that cannot be
    written costs only the next process a probe of its own, so it is logged, not raised."""
    for _ in range(2):
        try:
            if _link_new(path, record):
                break
        except OSError as error:
            log.warning("could not remember the precision probe in %s: %s", path, error)
            break
        written_first = _read(path)
        if written_first is not None:
            record = written_first
            break
        with contextlib.suppress(FileNotFoundError):  # not a record: taken away, then written once more
            path.unlink()
    _KNOWN[path] = record
    return record


def _link_new(path: Path, record: ProbeRecord) -> bool:
    """Creates `path` holding `record`, whole at once (linked from a finished file), unless it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".probe-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump(asdict(record), file)
        os.chmod(temporary, 0o644)  # other users of a shared Quail home read it too
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(temporary)


def _read(path: Path) -> ProbeRecord | None:
    try:
        fields = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("ignoring %s: %s", path, error)
        return None
    if not _is_record(fields):
        log.warning("ignoring %s: not a precision probe record", path)
        return None
    return ProbeRecord(float(fields["bf16_flops"]), float(fields["fp32_flops"]), fields["measured_on"])


def _is_record(fields: object) -> bool:
    if not isinstance(fields, dict):
        return False
    rates = (fields.get("bf16_flops"), fields.get("fp32_flops"))
    return (all(isinstance(r, int | float) and not isinstance(r, bool) and math.isfinite(r) and r > 0
                for r in rates)
            and isinstance(fields.get("measured_on"), str))


def _torch_version() -> str:
    """torch's version without importing it (seconds): a new torch may multiply at other rates."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"
