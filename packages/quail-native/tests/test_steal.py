"""The bench's steal share: the host's column of /proc/stat, summed over the windows it timed."""

from __future__ import annotations

from pathlib import Path

from quail_native.benchmark import steal
from quail_native.benchmark.steal import CpuTimes, StealMeter, parse_cpu_times

STAT = """cpu  833623 23995 136643 905298 9694 0 2716 36318 0 0
cpu0 416000 12000 68000 452000 4800 0 1300 18000 0 0
intr 123 0 0
"""


def test_the_aggregate_line_gives_every_jiffy_and_the_stolen_ones() -> None:
    assert parse_cpu_times(STAT) == CpuTimes(833623 + 23995 + 136643 + 905298 + 9694 + 0 + 2716 + 36318, 36318)


def test_a_kernel_without_a_steal_column_or_without_a_cpu_line_says_nothing() -> None:
    assert parse_cpu_times("cpu  1 2 3 4 5 6 7\n") is None  # before Linux 2.6.11: no steal
    assert parse_cpu_times("intr 1 2\n") is None
    assert parse_cpu_times("") is None


def test_the_meter_sums_only_its_windows(monkeypatch, tmp_path: Path) -> None:
    """Steal between windows is not counted; the share is of the CPU time inside them."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(steal, "PROC_STAT", stat)

    def at(total: int, stolen: int) -> None:
        stat.write_text(f"cpu  {total - stolen} 0 0 0 0 0 0 {stolen} 0 0\n")

    meter = StealMeter()
    at(1000, 10)
    with meter.window():
        at(1200, 30)  # 200 jiffies, 20 stolen
    at(5000, 900)  # outside any window
    with meter.window():
        at(5200, 900)  # 200 jiffies, none stolen
    assert (meter.total, meter.steal) == (400, 20)
    assert meter.note() is not None and "5.0% of this machine's CPU time" in meter.note()


def test_an_unreadable_stat_gives_no_note(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(steal, "PROC_STAT", tmp_path / "missing")
    meter = StealMeter()
    with meter.window():
        pass
    assert meter.note() is None
    assert StealMeter().note() is None  # nothing timed
