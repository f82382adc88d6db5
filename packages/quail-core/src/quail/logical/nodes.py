"""Immutable logical plan nodes: what the query asks, before any decision on how to run it."""

from __future__ import annotations

from dataclasses import dataclass

from quail.logical.expressions import (
    AiPredicate,
    ColumnRef,
    Equality,
    Label,
    OutputColumn,
    PairCondition,
    Prompt,
    Semantics,
)
from quail.schemas import SchemaType, describe


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
    """Rows of a table under an alias; `columns` are the ones the query needs.

    `where` (DuckDB SQL) keeps only the rows the query's column predicates allow, before any token;
    `source` is the DuckDB SQL of a relation that is not a registered table (a CTE or a subquery),
    read with the `ctes` clause in front.
    """

    table: str
    alias: str
    id_column: str | None
    columns: tuple[str, ...]
    where: str | None = None
    source: str | None = None
    ctes: str | None = None
    order: str | None = None
    """DuckDB ORDER BY keys the rows are numbered in: a LIMIT after ORDER BY over this table's columns then meets
    its rows in document order, so the model may stop early (`quail.compute.rounds`)."""

    @property
    def aliases(self) -> tuple[str, ...]:
        return (self.alias,)

    def label(self) -> str:
        where = f" WHERE {self.where}" if self.where else ""
        order = f" ORDER BY {self.order}" if self.order else ""
        return f"Scan {self.table} AS {self.alias} columns=[{', '.join(self.columns)}]{where}{order}"


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
    the right side's columns. `equalities` restrict the candidate pairs before the model runs, and so do
    `conditions`, a LEFT JOIN's own ON conditions between its two sides (they decide which pairs may match).
    """

    left: LogicalNode
    right: LogicalNode
    predicate: AiPredicate
    semantics: Semantics = "full"
    equalities: tuple[Equality, ...] = ()
    conditions: tuple[PairCondition, ...] = ()

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.left, self.right)

    @property
    def aliases(self) -> tuple[str, ...]:
        if self.semantics in ("full", "left"):
            return self.left.aliases + self.right.aliases
        return self.left.aliases

    @property
    def input_aliases(self) -> tuple[str, ...]:
        return self.left.aliases + self.right.aliases

    def label(self) -> str:
        restricting = [*(str(e) for e in self.equalities), *(c.sql for c in self.conditions)]
        restrict = f" restricted by {' AND '.join(restricting)}" if restricting else ""
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
class Verdict(LogicalNode):
    """AI_FILTER as a value: TRUE / FALSE per row into `output` (NULL for a NULL document); drops no row."""

    child: LogicalNode
    prompt: Prompt
    output: str
    position: int
    selectivity: float | None = None

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.child,)

    def label(self) -> str:
        return f"Verdict #{self.position} AI_FILTER({self.prompt}) AS {self.output}"


@dataclass(frozen=True)
class Generate(LogicalNode):
    """AI.GENERATE / AI_COMPLETE: the model's greedy continuation of the prompt per row, at most `max_tokens`
    tokens, into `output` (NULL for a NULL document)."""

    child: LogicalNode
    prompt: Prompt
    output: str
    position: int
    max_tokens: int
    schema: SchemaType | None = None
    """The fields a structured generation answers with (None: text)."""

    @property
    def children(self) -> tuple[LogicalNode, ...]:
        return (self.child,)

    def label(self) -> str:
        shape = f" as JSON of {describe(self.schema)}" if self.schema is not None else ""
        return f"Generate #{self.position} {self.prompt} AS {self.output}{shape} (at most {self.max_tokens} tokens)"


AiOutput = Classify | Score | Verdict | Generate
"""A node that adds an AI output column to every row."""


@dataclass(frozen=True)
class Project(LogicalNode):
    """The root: the relational tail, one DuckDB `statement` over the model's rows.

    The statement reads alias `relations[i]` as relation `__quail_rows_<i>` and the AI outputs as
    columns of `__quail`; `columns` are what it reads (table columns `alias.column`, AI outputs by
    name). `limit` stops the model's result early where that cannot change the answer.
    """

    child: LogicalNode
    columns: tuple[OutputColumn, ...]
    limit: int | None = None
    statement: str = ""
    relations: tuple[str, ...] = ()
    remarks: tuple[str, ...] = ()
    pair_conditions: tuple[PairCondition, ...] = ()
    """Conditions over two tables the statement applies: a join between them asks only the pairs that pass."""

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
        return (set(node.predicate.prompt.columns) | {c for e in node.equalities for c in (e.left, e.right)}
                | {c for condition in node.conditions for c in condition.columns})
    if isinstance(node, Join):
        return {c for e in node.equalities for c in (e.left, e.right)}
    if isinstance(node, AiOutput):
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
        if isinstance(node, AiOutput):
            outputs.add(node.output)
    for column in plan.columns:
        if column.source is None and column.name not in outputs:
            raise CompileError(f"result column {column.name!r} is produced by no AI output")
