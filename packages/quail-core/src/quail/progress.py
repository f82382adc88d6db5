"""Progress inside model nodes: how many of a node's items are answered, as the backend works.

A ModelExecution that can report progress implements `ProgressAware`; the runner hands it a
callback for the node it runs, which forwards to every listener on the registry (a CLI's bar).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from quail.physical.nodes import PhysicalNode

ItemProgress = Callable[[int, int], None]
"""(items done, items in total) for the node being run."""

ProgressListener = Callable[[PhysicalNode, int, int], None]


@runtime_checkable
class ProgressAware(Protocol):
    def set_progress(self, callback: ItemProgress | None) -> None: ...


@contextmanager
def reporting(execution: object, callback: ItemProgress | None) -> Iterator[None]:
    """`callback` receives `execution`'s progress while the block runs (when it can report and one is given)."""
    aware = isinstance(execution, ProgressAware) and callback is not None
    if aware:
        execution.set_progress(callback)
    try:
        yield
    finally:
        if aware:
            execution.set_progress(None)
