"""The report's view of a plan whose model work sits inside one backend-owned node.

A RequestExecution holds the native model steps (AiFilter, AiJoin, ...) and returns their answer
tables as ports named after them. The report's stage and minimum-token accounting reads model
steps by node id, so it is given the plan with those steps beside the outer nodes and the answer
tables under the steps' own ids — the same numbers a native plan of the same query reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import pyarrow as pa

from quail.physical.graph import PhysicalGraph
from quail.physical.nodes import PhysicalNode


@runtime_checkable
class HoldsModelSteps(Protocol):
    """A node that runs model steps inside itself and outputs each step's answers on a port named after it."""

    @property
    def model_steps(self) -> tuple[PhysicalNode, ...]: ...


def report_view(graph: PhysicalGraph, answers: Mapping[str, pa.Table]) -> tuple[PhysicalGraph, dict[str, pa.Table]]:
    """(the graph with inner model steps listed beside its nodes, answers keyed by every step's id)."""
    nodes = list(graph.nodes)
    tables = dict(answers)
    for node in graph.nodes:
        if isinstance(node, HoldsModelSteps):
            for step in node.model_steps:
                nodes.append(step)
                key = f"{node.id}.{step.id}"
                if key in answers:
                    tables[step.id] = answers[key]
    return PhysicalGraph(tuple(nodes), graph.edges, graph.root), tables
