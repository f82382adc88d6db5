"""QuerySpec: what a query says, before names are resolved — the meeting point of both front ends.

The SQL front end and the Python builder each produce a QuerySpec; `compile.py` turns it into a
logical plan with one set of checks, so both front ends accept and refuse exactly the same things.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from quail.logical.expressions import Label, ScoreThreshold

TableRole = Literal["from", "exists", "anti"]


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


@dataclass(frozen=True)
class TableSpec:
    """A table in FROM / JOIN (`from`), or the table of an [NOT] EXISTS subquery."""

    table: str
    alias: str
    role: TableRole = "from"
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
    classifies: tuple[ClassifySpec, ...] = ()
    label_filters: tuple[LabelFilterSpec, ...] = ()
    scores: tuple[ScoreSpec, ...] = ()
    limit: int | None = None
