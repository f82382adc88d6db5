"""Immutable logical plan nodes: what the query asks, before any decision on how to run it."""

from __future__ import annotations

from dataclasses import dataclass

from quail.logical.expressions import (
    AiPredicate,
    ColumnRef,
    Equality,
    Label,
    OutputColumn,
    Prompt,
    Semantics,
)


@dataclass(frozen=True)
class LogicalNode:
    """Base of every logical node; subclasses name their inputs in `children`."""

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return ()

    @property
    def aliases(self) -> tuple[str, ...]:
        """Aliases whose rows flow out of this node, in join order."""
        out: list[str] = []
        for child in self.children:
            out.extend(child.aliases)
        return tuple(out)

    def label(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class Scan(LogicalNode):
    """Rows of a registered table under an alias; `columns` are the ones the query needs."""

    table: str
    alias: str
    id_column: str
    columns: tuple[str, ...]

    @property
    def aliases(self) -> tuple[str, ...]:
        return (self.alias,)

    def label(self) -> str:
        return f"Scan {self.table} AS {self.alias} columns=[{', '.join(self.columns)}]"


@dataclass(frozen=True)
class SemanticFilter(LogicalNode):
    """AND-ed AI predicates over the documents of one alias."""

    child: LogicalNode
    alias: str
    predicates: tuple[AiPredicate, ...]

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.child,)

    def label(self) -> str:
        inner = "; ".join(p.describe() for p in self.predicates)
        return f"SemanticFilter {self.alias}: {inner}"


@dataclass(frozen=True)
class Join(LogicalNode):
    """A relational join on column equalities; with none it is a cross product."""

    left: LogicalNode
    right: LogicalNode
    equalities: tuple[Equality, ...] = ()

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.left, self.right)

    def label(self) -> str:
        on = " AND ".join(str(e) for e in self.equalities) or "TRUE (cross)"
        return f"Join ON {on}"


@dataclass(frozen=True)
class SemanticJoin(LogicalNode):
    """Pairs (tuples) of left and right rows for which an AI predicate holds.

    `exists` keeps left rows with at least one TRUE partner, `anti` those with none; both drop
    the right side's columns. `equalities` restrict the candidate pairs before the model runs.
    """

    left: LogicalNode
    right: LogicalNode
    predicate: AiPredicate
    semantics: Semantics = "full"
    equalities: tuple[Equality, ...] = ()

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.left, self.right)

    @property
    def aliases(self) -> tuple[str, ...]:
        if self.semantics == "full":
            return self.left.aliases + self.right.aliases
        return self.left.aliases

    @property
    def input_aliases(self) -> tuple[str, ...]:
        return self.left.aliases + self.right.aliases

    def label(self) -> str:
        restrict = f" restricted by {' AND '.join(str(e) for e in self.equalities)}" if self.equalities else ""
        return f"SemanticJoin {self.semantics}: {self.predicate.describe()}{restrict}"


@dataclass(frozen=True)
class Classify(LogicalNode):
    """AI.CLASSIFY: one label per row into `output`; `allowed` keeps only rows with those labels."""

    child: LogicalNode
    prompt: Prompt
    labels: tuple[Label, ...]
    output: str
    position: int
    allowed: tuple[str, ...] | None = None
    instructions: str | None = None

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.child,)

    def label(self) -> str:
        names = ", ".join(label.name for label in self.labels)
        keep = f" keep IN ({', '.join(self.allowed)})" if self.allowed is not None else ""
        return f"Classify #{self.position} {self.prompt} into [{names}] AS {self.output}{keep}"


@dataclass(frozen=True)
class Score(LogicalNode):
    """AI.SCORE in SELECT: sigmoid of the TRUE−FALSE margin per row into `output`."""

    child: LogicalNode
    prompt: Prompt
    output: str
    position: int

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.child,)

    def label(self) -> str:
        return f"Score #{self.position} {self.prompt} AS {self.output}"


@dataclass(frozen=True)
class Project(LogicalNode):
    """The root: the result columns, in order, and an optional LIMIT."""

    child: LogicalNode
    columns: tuple[OutputColumn, ...]
    limit: int | None = None

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.child,)

    def label(self) -> str:
        limit = f" LIMIT {self.limit}" if self.limit is not None else ""
        return f"Project [{', '.join(c.name for c in self.columns)}]{limit}"


def walk(node: LogicalNode) -> list[LogicalNode]:
    """Every node of the tree, parents before children."""
    out = [node]
    for child in node.children:
        out.extend(walk(child))
    return out


def render(node: LogicalNode, indent: int = 0) -> str:
    """The plan as an indented tree, one node per line."""
    lines = ["  " * indent + node.label()]
    lines.extend(render(child, indent + 1) for child in node.children)
    return "\n".join(lines)


def ai_predicates(node: LogicalNode) -> list[AiPredicate]:
    """Every AI predicate of the plan, in written order."""
    found: list[AiPredicate] = []
    for item in walk(node):
        if isinstance(item, SemanticFilter):
            found.extend(item.predicates)
        elif isinstance(item, SemanticJoin):
            found.append(item.predicate)
    return sorted(found, key=lambda p: p.position)


def referenced_columns(node: LogicalNode) -> set[ColumnRef]:
    """Columns a node itself reads (not those of its children)."""
    if isinstance(node, SemanticFilter):
        return {c for p in node.predicates for c in p.prompt.columns}
    if isinstance(node, SemanticJoin):
        return set(node.predicate.prompt.columns) | {c for e in node.equalities for c in (e.left, e.right)}
    if isinstance(node, Join):
        return {c for e in node.equalities for c in (e.left, e.right)}
    if isinstance(node, Classify | Score):
        return set(node.prompt.columns)
    if isinstance(node, Project):
        return {c.source for c in node.columns if c.source is not None}
    return set()


def validate_plan(plan: LogicalNode) -> None:
    """Every column a node reads comes from an alias its input provides; the root is a Project.

    Rules added by plugins rewrite plans; this catches a rewrite that lost track of an alias.
    """
    from quail.errors import CompileError

    if not isinstance(plan, Project):
        raise CompileError(f"a logical plan's root must be a Project, got {type(plan).__name__}")
    outputs: set[str] = set()
    for node in reversed(walk(plan)):
        available = {a for child in node.children for a in child.aliases}
        if isinstance(node, SemanticJoin):
            available = set(node.input_aliases)
        if isinstance(node, Scan):
            available = {node.alias}
        for column in referenced_columns(node):
            if column.alias not in available and not isinstance(node, Project):
                raise CompileError(f"{node.label()} reads {column} but its input has only {sorted(available)}")
        if isinstance(node, Classify | Score):
            outputs.add(node.output)
    for column in plan.columns:
        if column.source is None and column.name not in outputs:
            raise CompileError(f"result column {column.name!r} is produced by no AI output")
