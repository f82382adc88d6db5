"""Filter order: which AI predicate of an alias runs first, and the order of the rest.

The first stage scans every document (preamble + document + frame + question); each later
stage only asks its question tail of the survivors, whose document KV is kept. With every
stage's per-document cost fixed, trying each predicate first and ordering the rest by
rank = ask cost / (1 − selectivity) is optimal (the classic ordering of independent filters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quail.backends.base import OrderRule

DEFAULT_SELECTIVITY = 0.2


@dataclass(frozen=True)
class StagePrice:
    """One predicate of an alias, priced over all of its documents as first and as later stage."""

    position: int
    selectivity: float
    assumed: bool
    scan_seconds: float
    ask_seconds: float

    @property
    def rank(self) -> float:
        passing = 1.0 - self.selectivity
        return self.ask_seconds / passing if passing > 0 else float("inf")


@dataclass(frozen=True)
class FilterOrder:
    alias: str
    positions: tuple[int, ...]
    seconds: float
    survival: float
    reason: str


def selectivity_of(value: float | None) -> tuple[float, bool]:
    """A predicate's selectivity and whether it was assumed (not given by the user)."""
    return (DEFAULT_SELECTIVITY, True) if value is None else (value, False)


def expected_seconds(order: Sequence[StagePrice]) -> float:
    """The first stage scans everything; each later one asks only the documents still alive."""
    if not order:
        return 0.0
    total, alive = order[0].scan_seconds, order[0].selectivity
    for stage in order[1:]:
        total += alive * stage.ask_seconds
        alive *= stage.selectivity
    return total


def survival(stages: Sequence[StagePrice]) -> float:
    alive = 1.0
    for stage in stages:
        alive *= stage.selectivity
    return alive


def order_filters(alias: str, stages: Sequence[StagePrice], rule: OrderRule) -> FilterOrder:
    """The cheapest order (or the written one under `as_written`)."""
    if not stages:
        raise ValueError("order_filters needs at least one stage")
    if rule == "as_written":
        written = sorted(stages, key=lambda s: s.position)
        return FilterOrder(alias, tuple(s.position for s in written), expected_seconds(written),
                           survival(stages), "as written (order='as_written')")
    best: list[StagePrice] | None = None
    for first in stages:
        rest = sorted((s for s in stages if s is not first), key=lambda s: (s.rank, s.position))
        candidate = [first, *rest]
        if best is None or expected_seconds(candidate) < expected_seconds(best):
            best = candidate
    assert best is not None
    return FilterOrder(alias, tuple(s.position for s in best), expected_seconds(best), survival(stages),
                       _reason(best))


def _reason(order: Sequence[StagePrice]) -> str:
    if len(order) == 1:
        return "single predicate"
    first = order[0]
    ranks = ", ".join(f"#{s.position} rank {s.rank:.3g}" for s in order[1:])
    return (f"#{first.position} first (cheapest full scan given what it removes: selectivity "
            f"{first.selectivity:g}), then by rank = ask cost / (1 − selectivity): {ranks}")
