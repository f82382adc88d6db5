"""QuerySpec: what a query says, before names are resolved — the meeting point of both front ends.

The SQL front end and the Python builder each produce a QuerySpec; `compile.py` turns it into a
logical plan with one set of checks, so both front ends accept and refuse exactly the same things.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from quail.data.providers import TableSchema
from quail.logical.expressions import Example, Label, PairCondition, ScoreThreshold
from quail.schemas import SchemaType

TableRole = Literal["from", "exists", "anti", "left"]
"""`from`: FROM / inner JOIN; `exists` / `anti`: an [NOT] EXISTS subquery's table; `left`: LEFT JOIN ON AI_FILTER."""


@dataclass(frozen=True)
class Where:
    """A position in the SQL text (1-based), or nowhere for builder calls."""

    line: int | None = None
    column: int | None = None


NOWHERE = Where()


@dataclass(frozen=True)
class ColumnName:
    """A column as written: `qualifier.name` or a bare `name`."""

    qualifier: str | None
    name: str
    where: Where = NOWHERE

    def __str__(self) -> str:
        return f"{self.qualifier}.{self.name}" if self.qualifier else self.name


@dataclass(frozen=True)
class PromptSpec:
    template: str
    arguments: tuple[ColumnName, ...]
    where: Where = NOWHERE
    examples: tuple[Example, ...] = ()
    symmetric: bool = False


@dataclass(frozen=True)
class TableSpec:
    """A table in FROM / JOIN, or the table of an [NOT] EXISTS subquery.

    `source` is the DuckDB SQL of a relation that is not a registered table (a CTE's name or a
    parenthesised subquery), with its `schema`; None for a registered table.
    """

    table: str
    alias: str
    role: TableRole = "from"
    where: Where = NOWHERE
    source: str | None = None
    schema: TableSchema | None = None


@dataclass(frozen=True)
class ScanCondition:
    """A condition on one table's columns, with no AI call: it runs at the scan, before any token."""

    alias: str
    sql: str
    """DuckDB SQL."""
    where: Where = NOWHERE


@dataclass(frozen=True)
class EqualitySpec:
    left: ColumnName
    right: ColumnName
    on_of: str | None = None
    where: Where = NOWHERE
    subquery_of: str | None = None


@dataclass(frozen=True)
class PredicateSpec:
    """AI_FILTER / AI.IF, or an AI.SCORE comparison, with its options.

    `on_of` names the alias whose JOIN ... ON clause holds it; `subquery_of` the alias of the
    EXISTS subquery whose WHERE holds it.
    """

    prompt: PromptSpec
    order: int
    selectivity: float | None = None
    anchor: str | None = None
    threshold: ScoreThreshold | None = None
    on_of: str | None = None
    subquery_of: str | None = None
    where: Where = NOWHERE


@dataclass(frozen=True)
class ClassifySpec:
    prompt: PromptSpec
    labels: tuple[Label, ...]
    output: str
    order: int
    instructions: str | None = None
    where: Where = NOWHERE


@dataclass(frozen=True)
class LabelFilterSpec:
    """`WHERE output IN ('a', ...)` over a classification's output."""

    output: str
    allowed: tuple[str, ...]
    where: Where = NOWHERE


@dataclass(frozen=True)
class ScoreSpec:
    prompt: PromptSpec
    output: str
    order: int
    where: Where = NOWHERE


@dataclass(frozen=True)
class GenerateSpec:
    """AI.GENERATE / AI_COMPLETE: text generated per row, at most `max_tokens` tokens."""

    prompt: PromptSpec
    output: str
    order: int
    max_tokens: int
    schema: SchemaType | None = None
    where: Where = NOWHERE


@dataclass(frozen=True)
class VerdictSpec:
    """AI_FILTER / AI.IF as a value (inside OR, NOT, CASE, SELECT, ...): a BOOLEAN column per row."""

    prompt: PromptSpec
    output: str
    order: int
    selectivity: float | None = None
    where: Where = NOWHERE


@dataclass(frozen=True)
class RelationalSpec:
    """The relational tail of a SQL statement: one DuckDB statement over the model's rows.

    `statement` reads each alias of `relations` as `__quail_rows_<i>` (the alias's scan view, row by
    row of the model's result) and the AI outputs as columns of `__quail`; `reads` are the table
    columns it reads; `remarks` say what runs where (the LIMIT decision, for one).
    """

    statement: str
    relations: tuple[str, ...]
    reads: tuple[ColumnName, ...] = ()
    outputs: tuple[str, ...] = ()
    remarks: tuple[str, ...] = ()


SelectKind = Literal["star", "alias_star", "column", "output"]


@dataclass(frozen=True)
class SelectItem:
    """`*`, `alias.*`, a column, or a named AI output (AI.CLASSIFY / AI.SCORE ... AS name)."""

    kind: SelectKind
    column: ColumnName | None = None
    alias: str | None = None
    output: str | None = None
    where: Where = NOWHERE


@dataclass(frozen=True)
class QuerySpec:
    tables: tuple[TableSpec, ...]
    select: tuple[SelectItem, ...]
    predicates: tuple[PredicateSpec, ...] = ()
    equalities: tuple[EqualitySpec, ...] = ()
    pair_conditions: tuple[PairCondition, ...] = ()
    """Conditions over two tables' columns in WHERE or an inner ON: they also restrict the pairs a join asks."""
    left_conditions: tuple[tuple[str, PairCondition], ...] = ()
    """(joined alias, condition) for a LEFT JOIN's ON conditions between its table and an earlier one: they decide
    which pairs may match, before the unmatched rows are NULL-extended."""
    scan_order: tuple[str, str] | None = None
    """(alias, DuckDB ORDER BY keys) when the query's ORDER BY reads only the one table the model reads: its scan is
    numbered in that order, so the LIMIT after it may stop the model early."""
    classifies: tuple[ClassifySpec, ...] = ()
    label_filters: tuple[LabelFilterSpec, ...] = ()
    scores: tuple[ScoreSpec, ...] = ()
    limit: int | None = None
    verdicts: tuple[VerdictSpec, ...] = ()
    generates: tuple[GenerateSpec, ...] = ()
    scan: tuple[ScanCondition, ...] = ()
    links: tuple[tuple[str, ...], ...] = ()
    """Aliases that conditions of the relational tail connect (so they are not a bare cross product)."""
    ctes: str | None = None
    """The DuckDB `WITH ...` clause the scans of derived tables and scan conditions may read."""
    relational: RelationalSpec | None = None
    """None when the statement is a plain projection (the builder's shape): the compiler writes it."""
    remarks: tuple[str, ...] = ()
    """What the plan should say of the statement itself (options accepted but of no use to Quail)."""
    model: str | None = None
    """The catalog model the block's AI calls name (`frontend.models`); None: the session's."""
