"""Values inside logical nodes: column references, prompts, AI predicates, labels, outputs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Semantics = Literal["full", "exists", "anti", "left"]
"""full: matching tuples; exists / anti: left rows with / without a match; left: every left row, partners or NULLs."""
Comparison = Literal[">=", ">", "<=", "<"]

PLACEHOLDER = re.compile(r"\{(\d+)\}")


@dataclass(frozen=True, order=True)
class ColumnRef:
    """`alias.column` — every column a plan touches is qualified by its table alias."""

    alias: str
    column: str

    def __str__(self) -> str:
        return f"{self.alias}.{self.column}"


@dataclass(frozen=True)
class Example:
    """A demonstration: a document's text and the answer the model should give for it (TRUE / FALSE, or a label)."""

    text: str
    answer: str


@dataclass(frozen=True)
class Prompt:
    """A template whose `{i}` placeholder stands for the text of `columns[i]`, with its few-shot `examples`."""

    template: str
    columns: tuple[ColumnRef, ...]
    examples: tuple[Example, ...] = ()
    symmetric: bool = False
    """The answer for documents (a, b) is the answer for (b, a): a pair asked in both orders is asked once."""

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(c.alias for c in self.columns)

    def placeholder_numbers(self) -> list[int]:
        return [int(m) for m in PLACEHOLDER.findall(self.template)]

    def __str__(self) -> str:
        args = "".join(f", {c}" for c in self.columns)
        shots = f" with {len(self.examples)} example{'s' if len(self.examples) != 1 else ''}" if self.examples else ""
        both = " (symmetric)" if self.symmetric else ""
        return f"PROMPT({self.template!r}{args}){shots}{both}"


@dataclass(frozen=True)
class ScoreThreshold:
    """`AI.SCORE(...) <op> value`: the predicate is TRUE where the score compares so."""

    op: Comparison
    value: float

    def holds(self, score: float) -> bool:
        if self.op == ">=":
            return score >= self.value
        if self.op == ">":
            return score > self.value
        if self.op == "<=":
            return score <= self.value
        return score < self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


@dataclass(frozen=True)
class AiPredicate:
    """One natural-language condition. `position` is its place in the query as written."""

    prompt: Prompt
    position: int
    selectivity: float | None = None
    anchor: str | None = None
    threshold: ScoreThreshold | None = None

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.prompt.aliases

    def describe(self) -> str:
        head = f"AI.SCORE({self.prompt}) {self.threshold}" if self.threshold else f"AI_FILTER({self.prompt})"
        extras = []
        if self.selectivity is not None:
            extras.append(f"selectivity={self.selectivity:g}")
        if self.anchor is not None:
            extras.append(f"anchor={self.anchor}")
        return f"#{self.position} {head}" + (f" [{', '.join(extras)}]" if extras else "")


@dataclass(frozen=True)
class Label:
    """A class of AI.CLASSIFY, optionally described for the model."""

    name: str
    description: str | None = None


@dataclass(frozen=True)
class Equality:
    """`left = right` between columns of two different aliases: restricts candidate pairs."""

    left: ColumnRef
    right: ColumnRef

    @property
    def aliases(self) -> tuple[str, str]:
        return (self.left.alias, self.right.alias)

    def __str__(self) -> str:
        return f"{self.left} = {self.right}"


@dataclass(frozen=True)
class PairCondition:
    """A condition over columns of two tables (`r1.id < r2.id`, a range, any DuckDB expression): the pairs a join
    asks the model about are only those that satisfy it. `sql` is DuckDB SQL whose column `"alias.column"` is
    `columns`' value; the condition is also applied where the query wrote it, so it only ever saves work."""

    sql: str
    columns: tuple[ColumnRef, ...]

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(sorted({c.alias for c in self.columns}))

    def __str__(self) -> str:
        return self.sql


@dataclass(frozen=True)
class OutputColumn:
    """One result column: a table column (`alias.column`) or a derived AI output by name."""

    name: str
    source: ColumnRef | None = None
