"""CPU time the hypervisor gave to other guests while the bench timed: the steal column of /proc/stat.

On a shared virtual machine the host runs other tenants on the same cores; every jiffy stolen from this
guest stretches whatever was being timed. Walls move by ±20 % between minutes on the 2-core machines
this project develops on, and the steal share says how much of that was the host. Linux only: elsewhere,
or where the kernel does not count steal, the bench says nothing about it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
STEAL_FIELD = 8
"""1-based position of steal on the aggregate `cpu` line (user nice system idle iowait irq softirq steal …)."""


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies summed over every CPU since boot: all of them (user to steal) and the stolen ones."""

    total: int
    steal: int


def parse_cpu_times(stat: str) -> CpuTimes | None:
    """The aggregate `cpu` line of a /proc/stat text; None without one or without a steal column.
    guest and guest_nice are not added: the kernel already counts them in user and nice."""
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            if len(fields) <= STEAL_FIELD or not all(f.isdigit() for f in fields[1:STEAL_FIELD + 1]):
                return None
            counts = [int(f) for f in fields[1:STEAL_FIELD + 1]]
            return CpuTimes(sum(counts), counts[-1])
    return None


def read_cpu_times() -> CpuTimes | None:
    try:
        return parse_cpu_times(PROC_STAT.read_text())
    except OSError:
        return None


class StealMeter:
    """Steal and total CPU time summed over the windows it timed (`window()`), for one note at the end."""

    def __init__(self) -> None:
        self.total = 0
        self.steal = 0
        self.readable = True

    @contextmanager
    def window(self) -> Iterator[None]:
        before = read_cpu_times()
        try:
            yield
        finally:
            after = read_cpu_times()
            if before is None or after is None:
                self.readable = False
            else:
                self.total += after.total - before.total
                self.steal += after.steal - before.steal

    def note(self) -> str | None:
        """The share stolen, as the bench's note; None where it could not be read (or nothing was timed)."""
        if not self.readable or self.total <= 0:
            return None
        return (f"host steal during the timed runs: {self.steal / self.total:.1%} of this machine's CPU time went "
                "to other guests of its host")
