"""PhysicalGraph: nodes, edges between named ports, and the root whose output is the result."""

from __future__ import annotations

from dataclasses import dataclass

from quail.errors import PlanEditError
from quail.physical.nodes import PhysicalNode, PortType


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

    def inputs_of(self, node_id: str) -> dict[str, Edge]:
        return {e.target_port: e for e in self.edges if e.target == node_id}

    def consumers_of(self, node_id: str) -> list[Edge]:
        return [e for e in self.edges if e.source == node_id]

    def topological_order(self) -> list[PhysicalNode]:
        """Nodes with every input before its consumer; raises PlanEditError on a cycle."""
        pending = {n.id: {e.source for e in self.edges if e.target == n.id} for n in self.nodes}
        order: list[PhysicalNode] = []
        ready = [n.id for n in self.nodes if not pending[n.id]]
        while ready:
            current = ready.pop(0)
            order.append(self.node(current))
            for edge in self.consumers_of(current):
                waiting = pending[edge.target]
                waiting.discard(current)
                if not waiting and edge.target not in [n.id for n in order] and edge.target not in ready:
                    ready.append(edge.target)
        if len(order) != len(self.nodes):
            stuck = sorted(set(pending) - {n.id for n in order})
            raise PlanEditError(f"the physical plan has a cycle through {', '.join(stuck)}")
        return order

    def validate(self) -> None:
        """Unique ids, known ports of matching types, every required input fed once, no cycle, a root."""
        ids = [n.id for n in self.nodes]
        duplicate = next((i for i in ids if ids.count(i) > 1), None)
        if duplicate is not None:
            raise PlanEditError(f"two physical nodes share the id {duplicate!r}")
        if self.root not in ids:
            raise PlanEditError(f"the root {self.root!r} is not a node of the plan")
        for edge in self.edges:
            if edge.source not in ids or edge.target not in ids:
                raise PlanEditError(f"edge {edge.source}.{edge.source_port} → {edge.target}.{edge.target_port} "
                                    "names a node that is not in the plan")
            self._check_edge(edge)
        for node in self.nodes:
            self._check_inputs(node)
        self.topological_order()
        if self.node(self.root).OUTPUTS.get("table") is not PortType.TABLE:
            raise PlanEditError(f"the root {self.root!r} must output a table (a Project)")

    def _check_edge(self, edge: Edge) -> None:
        source, target = self.node(edge.source), self.node(edge.target)
        produced = source.OUTPUTS.get(edge.source_port)
        wanted = target.INPUTS.get(edge.target_port)
        if produced is None:
            raise PlanEditError(f"{source.kind} {source.id!r} has no output port {edge.source_port!r}")
        if wanted is None:
            raise PlanEditError(f"{target.kind} {target.id!r} has no input port {edge.target_port!r}")
        if produced is not wanted:
            raise PlanEditError(f"{source.id}.{edge.source_port} produces {produced.value} but "
                                f"{target.id}.{edge.target_port} takes {wanted.value}")

    def _check_inputs(self, node: PhysicalNode) -> None:
        fed = [e.target_port for e in self.edges if e.target == node.id]
        for port in node.INPUTS:
            if fed.count(port) > 1:
                raise PlanEditError(f"input {node.id}.{port} is fed twice")
            if port not in fed and port not in node.OPTIONAL_INPUTS:
                raise PlanEditError(f"input {node.id}.{port} is not connected")
