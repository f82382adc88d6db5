"""User edits of a physical plan: insert, remove or move pass-through nodes that are not model nodes.

Every edit returns a new, validated graph; an edit that would run model work differently or
leave the plan invalid raises PlanEditError.
"""

from __future__ import annotations

from dataclasses import replace

from quail.errors import PlanEditError
from quail.physical.graph import Edge, PhysicalGraph
from quail.physical.nodes import PhysicalNode


def _node(graph: PhysicalGraph, node_id: str) -> PhysicalNode:
    try:
        return graph.node(node_id)
    except KeyError:
        raise PlanEditError(f"no node {node_id!r} in the plan; nodes are {[n.id for n in graph.nodes]}") from None


def _pass_through_port(node: PhysicalNode) -> tuple[str, str]:
    """(input port, output port) of a node with one input and one output of the same type."""
    if node.is_model_node:
        raise PlanEditError(f"{node.kind} {node.id!r} is a model node; only non-model nodes can be edited")
    if len(node.INPUTS) != 1 or len(node.OUTPUTS) != 1:
        raise PlanEditError(f"{node.kind} {node.id!r} is not a pass-through node (one input, one output)")
    (port_in, type_in), (port_out, type_out) = next(iter(node.INPUTS.items())), next(iter(node.OUTPUTS.items()))
    if type_in is not type_out:
        raise PlanEditError(f"{node.kind} {node.id!r} changes {type_in.value} into {type_out.value}")
    return port_in, port_out


def insert(graph: PhysicalGraph, node: PhysicalNode, after: str) -> PhysicalGraph:
    """Put `node` on every edge leaving `after` (its single output port)."""
    if any(n.id == node.id for n in graph.nodes):
        raise PlanEditError(f"a node with id {node.id!r} is already in the plan")
    port_in, port_out = _pass_through_port(node)
    anchor = _node(graph, after)
    leaving = [e for e in graph.edges if e.source == after]
    if not leaving:
        raise PlanEditError(f"{after!r} feeds nothing: nothing to insert after (it is the root)")
    if len({e.source_port for e in leaving}) != 1:
        raise PlanEditError(f"{anchor.kind} {after!r} has several outputs; say which edge to edit")
    source_port = leaving[0].source_port
    kept = tuple(e for e in graph.edges if e.source != after)
    rewired = tuple(replace(e, source=node.id, source_port=port_out) for e in leaving)
    edited = PhysicalGraph((*graph.nodes, node), (*kept, Edge(after, source_port, node.id, port_in), *rewired),
                           graph.root)
    edited.validate()
    return edited


def remove(graph: PhysicalGraph, node_id: str) -> PhysicalGraph:
    """Take a pass-through node out and connect its input straight to its consumers."""
    node = _node(graph, node_id)
    port_in, _ = _pass_through_port(node)
    if node_id == graph.root:
        raise PlanEditError(f"{node_id!r} is the root of the plan")
    feeding = graph.inputs_of(node_id)[port_in]
    leaving = graph.consumers_of(node_id)
    kept = tuple(e for e in graph.edges if node_id not in (e.source, e.target))
    rewired = tuple(replace(e, source=feeding.source, source_port=feeding.source_port) for e in leaving)
    edited = PhysicalGraph(tuple(n for n in graph.nodes if n.id != node_id), (*kept, *rewired), graph.root)
    edited.validate()
    return edited


def move(graph: PhysicalGraph, node_id: str, after: str) -> PhysicalGraph:
    """Remove a pass-through node and insert it after another node."""
    if node_id == after:
        raise PlanEditError(f"cannot move {node_id!r} after itself")
    node = _node(graph, node_id)
    _node(graph, after)
    return insert(remove(graph, node_id), node, after)
