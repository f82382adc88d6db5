"""The shape of a compiled logical plan, taken apart so the planner can reorder its pieces.

A plan is Project ← AI outputs (Classify / Score / Verdict) ← EXISTS / NOT EXISTS / LEFT joins ← the
FROM tree, a left-deep tree of Join / SemanticJoin over per-alias leaves (Scan with its SemanticFilter).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quail.logical.expressions import AiPredicate, Equality, PairCondition, Semantics
from quail.logical.nodes import (
    AiOutput,
    Join,
    LogicalNode,
    Project,
    Scan,
    SemanticFilter,
    SemanticJoin,
)


@dataclass(frozen=True)
class Leaf:
    """One alias: its scan and the AI filters on its documents (predicates in plan order)."""

    alias: str
    scan: Scan
    predicates: tuple[AiPredicate, ...]

    def node(self, predicates: tuple[AiPredicate, ...] | None = None) -> LogicalNode:
        chosen = self.predicates if predicates is None else predicates
        return SemanticFilter(self.scan, self.alias, chosen) if chosen else self.scan


@dataclass(frozen=True)
class SubqueryJoin:
    """An EXISTS / NOT EXISTS / LEFT join: the outer plan meets one inner alias."""

    leaf: Leaf
    predicate: AiPredicate
    semantics: Semantics
    equalities: tuple[Equality, ...]
    conditions: tuple[PairCondition, ...] = ()
    """A LEFT join's own ON conditions between its sides (they decide which pairs may match)."""


@dataclass(frozen=True)
class PlanShape:
    project: Project
    outputs: tuple[AiOutput, ...]
    subqueries: tuple[SubqueryJoin, ...]
    leaves: tuple[Leaf, ...]
    join_predicates: tuple[AiPredicate, ...]
    equalities: tuple[Equality, ...]

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(leaf.alias for leaf in self.leaves)

    def leaf(self, alias: str) -> Leaf:
        for leaf in (*self.leaves, *(s.leaf for s in self.subqueries)):
            if leaf.alias == alias:
                return leaf
        raise KeyError(alias)


def shape_of(plan: LogicalNode) -> PlanShape:
    if not isinstance(plan, Project):
        raise ValueError("a logical plan's root is a Project")
    node = plan.child
    outputs: list[AiOutput] = []
    while isinstance(node, AiOutput):
        outputs.append(node)
        node = node.child
    subqueries: list[SubqueryJoin] = []
    while isinstance(node, SemanticJoin) and node.semantics != "full":
        subqueries.append(SubqueryJoin(_leaf(node.right), node.predicate, node.semantics, node.equalities,
                                       node.conditions))
        node = node.left
    leaves: list[Leaf] = []
    predicates: list[AiPredicate] = []
    equalities: list[Equality] = []
    _flatten(node, leaves, predicates, equalities)
    return PlanShape(plan, tuple(reversed(outputs)), tuple(reversed(subqueries)), tuple(leaves), tuple(predicates),
                     tuple(equalities))


def _flatten(node: LogicalNode, leaves: list[Leaf], predicates: list[AiPredicate],
             equalities: list[Equality]) -> None:
    if isinstance(node, Join | SemanticJoin):
        _flatten(node.left, leaves, predicates, equalities)
        leaves.append(_leaf(node.right))
        equalities.extend(node.equalities)
        if isinstance(node, SemanticJoin):
            predicates.append(node.predicate)
        return
    leaves.append(_leaf(node))


def _leaf(node: LogicalNode) -> Leaf:
    if isinstance(node, Scan):
        return Leaf(node.alias, node, ())
    if isinstance(node, SemanticFilter) and isinstance(node.child, Scan):
        return Leaf(node.alias, node.child, node.predicates)
    raise ValueError(f"unexpected node where a table's leaf belongs: {node.label()}")


def rebuild(shape: PlanShape, leaves: dict[str, LogicalNode], order: tuple[str, ...],
            predicates: dict[int, AiPredicate], subqueries: tuple[SubqueryJoin, ...]) -> Project:
    """The plan with the FROM tree joined in `order`, predicates (anchors) and filters replaced."""
    tree = leaves[order[0]]
    joined = {order[0]}
    for alias in order[1:]:
        now = joined | {alias}
        completing = [p for p in shape.join_predicates if alias in p.aliases and set(p.aliases) <= now]
        restricting = tuple(e for e in shape.equalities if alias in e.aliases and set(e.aliases) <= now)
        if completing:
            tree = SemanticJoin(tree, leaves[alias], predicates[completing[0].position], "full", restricting)
        else:
            tree = Join(tree, leaves[alias], restricting)
        joined = now
    for subquery in subqueries:
        tree = SemanticJoin(tree, leaves[subquery.leaf.alias], subquery.predicate, subquery.semantics,
                            subquery.equalities, subquery.conditions)
    for output in shape.outputs:
        tree = replace(output, child=tree)
    return replace(shape.project, child=tree)
