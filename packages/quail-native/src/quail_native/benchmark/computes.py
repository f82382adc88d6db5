"""`quail bench --compute`: the same workloads on several compute providers, printed as ratios to `local`.

A distributed provider's rows carry each shard's wall time: on one small machine the ratio says what
splitting costs here, and the per-shard times say how it would scale where every worker has its own
cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from quail.extend import ReportValue


class ComputeRow(Protocol):
    """What the comparison reads of a benchmark row."""

    @property
    def workload(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def compute(self) -> str: ...
    @property
    def wall_s(self) -> float: ...
    @property
    def shard_walls(self) -> tuple[float, ...]: ...


def computes_of(argument: str) -> list[str]:
    """The providers to run, `local` first (the baseline every other one is compared with)."""
    named = [c.strip() for c in argument.split(",") if c.strip()]
    return ["local", *dict.fromkeys(c for c in named if c != "local")]


def labelled(backend: str, compute: str) -> str:
    """How a row names where it ran: the backend, and the provider when it is not `local`."""
    return backend if compute == "local" else f"{backend} on {compute}"


def shard_walls(report: dict[str, ReportValue]) -> tuple[float, ...]:
    """Wall seconds of every shard that answered (cancelled shards have none)."""
    shards = report.get("shards")
    if not isinstance(shards, list):
        return ()
    return tuple(float(s["wall_s"]) for s in shards if isinstance(s, dict) and isinstance(s["wall_s"], int | float))


def compute_lines(rows: Sequence[ComputeRow]) -> list[str]:
    """Per backend and provider other than local: its wall over local's on the same workloads, and the
    per-shard times (the largest shard bounds a query's model work on a cluster of separate machines)."""
    lines = []
    local = {(r.backend, r.workload): r for r in rows if r.compute == "local"}
    for backend, compute in dict.fromkeys((r.backend, r.compute) for r in rows if r.compute != "local"):
        paired = [(r, local[(backend, r.workload)]) for r in rows
                  if (r.backend, r.compute) == (backend, compute) and (backend, r.workload) in local]
        if not paired:
            continue
        ratio = sum(r.wall_s for r, _ in paired) / sum(base.wall_s for _, base in paired)
        lines.append(f"ratio {compute}/local wall ({backend}): {ratio:.3f} over {len(paired)} queries (boot excluded)")
        for row, _ in paired:
            shards = ", ".join(f"{wall:.2f}" for wall in row.shard_walls) or "none"
            lines.append(f"  {row.workload} on {compute}: shard walls {shards} s")
    return lines
