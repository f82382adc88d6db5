"""Logical rules: named rewrites of a plan, each returning a new plan, run to a fixpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from quail.logical.nodes import (
    AiOutput,
    Join,
    LogicalNode,
    Project,
    Scan,
    SemanticFilter,
    SemanticJoin,
    referenced_columns,
    walk,
)

MAX_PASSES = 8


@runtime_checkable
class LogicalRule(Protocol):
    """A rewrite of a whole logical plan. It must return an equal plan when it has nothing to do."""

    name: str

    def rewrite(self, plan: LogicalNode) -> LogicalNode: ...


def run_rules(plan: LogicalNode, rules: Sequence[LogicalRule], max_passes: int = MAX_PASSES) -> LogicalNode:
    """Apply every rule in order, pass after pass, until a pass changes nothing."""
    for _ in range(max_passes):
        before = plan
        for rule in rules:
            plan = rule.rewrite(plan)
        if plan == before:
            return plan
    return plan


class FilterPushdown:
    """Moves each alias's SemanticFilter down to just above its Scan, merging filters of one alias.

    Filters commute with joins (into the side that holds their alias), with filters of other
    aliases, and with row-wise AI outputs, so the cheapest place to drop a document is the first.
    """

    name = "filter_pushdown"

    def rewrite(self, plan: LogicalNode) -> LogicalNode:
        return self._visit(plan)

    def _visit(self, node: LogicalNode) -> LogicalNode:
        node = _with_children(node, [self._visit(child) for child in node.children])
        if isinstance(node, SemanticFilter):
            return self._push(node)
        return node

    def _push(self, node: SemanticFilter) -> LogicalNode:
        child = node.child
        if isinstance(child, SemanticFilter) and child.alias == node.alias:
            merged = tuple(sorted(child.predicates + node.predicates, key=lambda p: p.position))
            return SemanticFilter(child.child, node.alias, merged)
        if isinstance(child, SemanticJoin) and child.semantics == "left" and node.alias in child.right.aliases:
            return node  # a filter on the NULL-extended side of a LEFT JOIN does not commute with it
        if isinstance(child, Join | SemanticJoin):
            side = "left" if node.alias in child.left.aliases else "right"
            inner = getattr(child, side)
            return replace(child, **{side: self._push(replace(node, child=inner))})
        if isinstance(child, SemanticFilter | AiOutput):
            return replace(child, child=self._push(replace(node, child=child.child)))
        return node


class ProjectionPushdown:
    """Each Scan reads only its id column and the columns something above it references."""

    name = "projection_pushdown"

    def rewrite(self, plan: LogicalNode) -> LogicalNode:
        needed: dict[str, set[str]] = {}
        for node in walk(plan):
            for column in referenced_columns(node):
                needed.setdefault(column.alias, set()).add(column.column)
        return self._visit(plan, needed)

    def _visit(self, node: LogicalNode, needed: dict[str, set[str]]) -> LogicalNode:
        if isinstance(node, Scan):
            keep = needed.get(node.alias, set()) | ({node.id_column} if node.id_column else set())
            return replace(node, columns=tuple(c for c in node.columns if c in keep))
        return _with_children(node, [self._visit(child, needed) for child in node.children])


def _with_children(node: LogicalNode, children: list[LogicalNode]) -> LogicalNode:
    if not children or list(node.children) == children:
        return node
    if isinstance(node, Join | SemanticJoin):
        return replace(node, left=children[0], right=children[1])
    if isinstance(node, SemanticFilter | AiOutput | Project):
        return replace(node, child=children[0])
    raise TypeError(f"{type(node).__name__} has children but no rebuild rule")


BUILT_IN_RULES: tuple[LogicalRule, ...] = (FilterPushdown(), ProjectionPushdown())
