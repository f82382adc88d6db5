"""Calibration: a predicate's mean margin over content-free documents, the offset a TRUE answer must beat.

The planner supplies the prompts (the predicate over each content-free document); their items ride
at the front of the node's first pass (`state.Lead`), so the offsets are known before the node
judges its first answer without a pass of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from quail_native.executor.packing import Item, ItemResult
from quail_native.executor.state import Lead, SharedState, Tokens


@dataclass
class Calibration:
    prompts: Mapping[int, list[Tokens]]
    """Predicate position → its prompt (preamble included) over every content-free document."""
    margin_of: Callable[[ItemResult], float]
    offsets: dict[int, float] = field(default_factory=dict)
    """Predicate position → mean margin, once the lead has run; empty for an uncalibrated node."""

    def lead(self, state: SharedState, preamble: Tokens) -> Lead | None:
        """The prompts as items after the shared preamble (computed once for all), or None without prompts."""
        if not any(self.prompts.values()):
            return None
        pre = state.preamble(preamble)
        start = len(preamble)
        prompts = [p for group in self.prompts.values() for p in group]
        items = [Item(p[start:], start, (pre,), (len(p) - start - 1,)) for p in prompts]
        return Lead(items, self._finish)

    def offset(self, position: int) -> float:
        return self.offsets.get(position, 0.0)

    def reported(self) -> tuple[tuple[int, float], ...] | None:
        """(position, offset) in the predicates' order, for the node's metrics; None when uncalibrated."""
        return tuple(self.offsets.items()) or None

    def _finish(self, results: list[ItemResult]) -> None:
        margins = iter(self.margin_of(result) for result in results)
        for position, group in self.prompts.items():
            self.offsets[position] = sum(next(margins) for _ in group) / len(group)
