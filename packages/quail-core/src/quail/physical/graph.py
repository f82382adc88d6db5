"""PhysicalGraph: nodes, edges between named ports, and the root whose output is the result."""

from __future__ import annotations

from dataclasses import dataclass

from quail.physical.nodes import PhysicalNode


@dataclass(frozen=True)
class Edge:
    """Output `source_port` of node `source` feeds input `target_port` of node `target`."""

    source: str
    source_port: str
    target: str
    target_port: str


@dataclass(frozen=True)
class PhysicalGraph:
    nodes: tuple[PhysicalNode, ...]
    edges: tuple[Edge, ...]
    root: str

    def node(self, node_id: str) -> PhysicalNode:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(f"no physical node {node_id!r}; nodes are {[n.id for n in self.nodes]}")
