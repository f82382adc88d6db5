"""Immutable logical plan nodes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LogicalNode:
    """Base of every logical node; subclasses name their inputs in `children`."""

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return ()
