"""The Python builder: `session.docs("reviews").alias("r").ai_filter(prompt(...))...select(...)`.

Every call returns a new, immutable builder and checks the query so far, so a mistake raises
CompileError at the call that made it. The result is the same QuerySpec the SQL front end reads,
compiled by the same code: a builder query and its SQL spelling give equal logical plans.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from quail.data.providers import TableSchema
from quail.errors import CompileError
from quail.frontend.compile import compile_query
from quail.frontend.spec import (
    ClassifySpec,
    ColumnName,
    EqualitySpec,
    LabelFilterSpec,
    PredicateSpec,
    PromptSpec,
    QuerySpec,
    ScoreSpec,
    SelectItem,
)
from quail.logical.expressions import Comparison, Label, ScoreThreshold, Semantics

if TYPE_CHECKING:
    from quail.backends.base import OrderRule
    from quail.runtime.coordinator import Query

SEMANTICS: tuple[Semantics, ...] = ("full", "exists", "anti")


@dataclass(frozen=True, eq=False)
class Col:
    """A column for the builder; `col("a.x") == col("b.y")` makes a join equality."""

    name: ColumnName

    def __eq__(self, other: object) -> EqualityExpr:  # type: ignore[override]
        if not isinstance(other, Col):
            raise CompileError(f"{self.name} == {other!r}: equalities compare two columns, col(...) == col(...)")
        return EqualityExpr(self.name, other.name)

    __hash__ = object.__hash__


@dataclass(frozen=True)
class EqualityExpr:
    left: ColumnName
    right: ColumnName


@dataclass(frozen=True)
class PromptExpr:
    spec: PromptSpec


@dataclass(frozen=True)
class ScoreCondition:
    prompt: PromptExpr
    threshold: ScoreThreshold


@dataclass(frozen=True, eq=False)
class ScoreExpr:
    """`score(prompt(...)) >= 0.8` — an AI.SCORE comparison for `ai_filter` / `ai_join`."""

    prompt: PromptExpr

    def _compare(self, op: Comparison, value: float) -> ScoreCondition:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CompileError(f"score(...) {op} {value!r}: compare with a number in [0, 1]")
        return ScoreCondition(self.prompt, ScoreThreshold(op, float(value)))

    def __ge__(self, value: float) -> ScoreCondition:
        return self._compare(">=", value)

    def __gt__(self, value: float) -> ScoreCondition:
        return self._compare(">", value)

    def __le__(self, value: float) -> ScoreCondition:
        return self._compare("<=", value)

    def __lt__(self, value: float) -> ScoreCondition:
        return self._compare("<", value)


Condition = PromptExpr | ScoreCondition


def col(name: str) -> Col:
    """`col("r.body")` or `col("body")` when unambiguous."""
    parts = name.split(".") if isinstance(name, str) else []
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise CompileError(f"col({name!r}): write 'alias.column' or 'column'")
    return Col(ColumnName(parts[0] if len(parts) == 2 else None, parts[-1]))


def _labels(labels: Sequence[str | tuple[str, str]]) -> tuple[Label, ...]:
    if isinstance(labels, str) or not isinstance(labels, list | tuple):
        raise CompileError(f"labels are a list of strings or (label, description) pairs, got {labels!r}")
    parsed = []
    for label in labels:
        if isinstance(label, str):
            parsed.append(Label(label))
        elif isinstance(label, tuple) and len(label) == 2 and all(isinstance(x, str) for x in label):
            parsed.append(Label(label[0], label[1]))
        else:
            raise CompileError(f"a label is a string or a (label, description) pair of strings, got {label!r}")
    return tuple(parsed)


def prompt(template: str, *columns: Col, symmetric: bool = False) -> PromptExpr:
    """`prompt('Does {0} praise the acting?', col("r.body"))`; `symmetric=True` for a question over two documents
    whose answer does not depend on their order (each pair asked in both orders is asked once)."""
    if not isinstance(symmetric, bool):
        raise TypeError(f"prompt(symmetric=...) takes True or False, got {symmetric!r}")
    if not isinstance(template, str):
        raise TypeError(f"prompt() takes its template as a str, got {type(template).__name__} {template!r}")
    for column in columns:
        if not isinstance(column, Col):
            raise CompileError(f"prompt(...) takes col(...) arguments after the template, got {column!r}")
    return PromptExpr(PromptSpec(template, tuple(c.name for c in columns), symmetric=symmetric))


def score(of: PromptExpr) -> ScoreExpr:
    return ScoreExpr(_prompt_of(of, "score"))


def _prompt_of(value: object, method: str) -> PromptExpr:
    if not isinstance(value, PromptExpr):
        raise CompileError(f"{method}(...) takes prompt('…{{0}}…', col(...)), got {value!r}")
    return value


@dataclass(frozen=True)
class Docs:
    """An immutable query under construction, started by `session.docs(table)`."""

    catalog: Callable[[], Mapping[str, TableSchema]] = field(repr=False, compare=False)
    run: Callable[[QuerySpec, OrderRule | None], Query] = field(repr=False, compare=False)
    spec: QuerySpec = field(default_factory=lambda: QuerySpec(tables=(), select=()))
    counter: int = 0

    # -- tables -------------------------------------------------------------------------------

    def alias(self, name: str) -> Docs:
        if len(self.spec.tables) != 1:
            raise CompileError("alias(...) names a single table; call it right after docs(...)")
        if not name.isidentifier():
            raise CompileError(f"alias {name!r} is not an identifier")
        table = replace(self.spec.tables[0], alias=name)
        return self._checked(replace(self.spec, tables=(table,)), self.counter)

    def join(self, other: Docs, on: EqualityExpr | Sequence[EqualityExpr]) -> Docs:
        """A relational join on column equalities; follow it with an AI predicate over the pair."""
        equalities = [on] if isinstance(on, EqualityExpr) else list(on) if isinstance(on, list | tuple) else []
        if not equalities or not all(isinstance(e, EqualityExpr) for e in equalities):
            raise CompileError("join(other, on=...) takes col(...) == col(...) equalities")
        merged, counter = self._merged(other, "from")
        added = tuple(EqualitySpec(e.left, e.right) for e in equalities)
        return self._checked(replace(merged, equalities=merged.equalities + added), counter)

    # -- AI predicates ------------------------------------------------------------------------

    def ai_filter(self, condition: Condition, selectivity: float | None = None, anchor: str | None = None) -> Docs:
        predicate = self._predicate(condition, self.counter + 1, selectivity, anchor, None, "ai_filter")
        return self._checked(replace(self.spec, predicates=(*self.spec.predicates, predicate)), self.counter + 1)

    ai_if = ai_filter

    def ai_join(self, other: Docs | Sequence[Docs], condition: Condition, selectivity: float | None = None,
                anchor: str | None = None, semantics: Semantics = "full") -> Docs:
        if semantics not in SEMANTICS:
            raise CompileError(f"semantics must be one of {', '.join(SEMANTICS)}, got {semantics!r}")
        others = [other] if isinstance(other, Docs) else list(other)
        if semantics != "full" and len(others) != 1:
            raise CompileError(f"an {semantics} join takes exactly one other table")
        merged, counter = self, self.counter
        for item in others:
            role = "from" if semantics == "full" else semantics
            spec, counter = merged._merged(item, role)
            merged = replace(merged, spec=spec, counter=counter)
        subquery = others[0].spec.tables[0].alias if semantics != "full" else None
        predicate = self._predicate(condition, counter + 1, selectivity, anchor, subquery, "ai_join")
        spec = merged.spec
        return self._checked(replace(spec, predicates=(*spec.predicates, predicate)), counter + 1)

    def ai_classify(self, input: Col | PromptExpr, labels: Sequence[str | tuple[str, str]], name: str,
                    task_description: str | None = None) -> Docs:
        if isinstance(input, Col):
            input = PromptExpr(PromptSpec("{0}", (input.name,)))
        if task_description is not None and not isinstance(task_description, str):
            raise CompileError(f"task_description must be a string, got {task_description!r}")
        parsed = _labels(labels)
        item = ClassifySpec(_prompt_of(input, "ai_classify").spec, parsed, name, self.counter + 1, task_description)
        spec = replace(self.spec, classifies=(*self.spec.classifies, item),
                       select=(*self.spec.select, SelectItem("output", output=name)))
        return self._checked(spec, self.counter + 1)

    def label_in(self, name: str, *labels: str) -> Docs:
        item = LabelFilterSpec(name, tuple(labels))
        return self._checked(replace(self.spec, label_filters=(*self.spec.label_filters, item)), self.counter)

    def ai_score(self, of: PromptExpr, name: str) -> Docs:
        item = ScoreSpec(_prompt_of(of, "ai_score").spec, name, self.counter + 1)
        spec = replace(self.spec, scores=(*self.spec.scores, item),
                       select=(*self.spec.select, SelectItem("output", output=name)))
        return self._checked(spec, self.counter + 1)

    # -- result -------------------------------------------------------------------------------

    def limit(self, n: int) -> Docs:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise CompileError(f"limit(n) takes a non-negative integer, got {n!r}")
        return self._checked(replace(self.spec, limit=n), self.counter)

    def select(self, *columns: str | Col, order: OrderRule | None = None) -> Query:
        """The query: the named columns (all of them when none are named) and the AI outputs."""
        items = tuple(self._select_item(c) for c in columns) if columns else (SelectItem("star"),)
        outputs = tuple(i for i in self.spec.select if i.kind == "output" and i not in items)
        spec = replace(self.spec, select=items + outputs)
        return self.run(spec, order)

    def _select_item(self, column: str | Col) -> SelectItem:
        outputs = {i.output for i in self.spec.select if i.kind == "output"}
        if isinstance(column, str) and column in outputs:
            return SelectItem("output", output=column)
        if isinstance(column, str) and column == "*":
            return SelectItem("star")
        if isinstance(column, str) and column.endswith(".*"):
            return SelectItem("alias_star", alias=column[:-2])
        name = col(column).name if isinstance(column, str) else column.name
        return SelectItem("column", column=name)

    # -- internals ----------------------------------------------------------------------------

    def _predicate(self, condition: Condition, order: int, selectivity: float | None, anchor: str | None,
                   subquery_of: str | None, method: str) -> PredicateSpec:
        if isinstance(selectivity, bool) or (selectivity is not None and not isinstance(selectivity, int | float)):
            raise CompileError(f"selectivity must be a number in [0, 1], got {selectivity!r}")
        threshold = None
        if isinstance(condition, ScoreCondition):
            condition, threshold = condition.prompt, condition.threshold
        spec = _prompt_of(condition, method).spec
        value = None if selectivity is None else float(selectivity)
        return PredicateSpec(spec, order, value, anchor, threshold, None, subquery_of)

    def _merged(self, other: Docs, role: str) -> tuple[QuerySpec, int]:
        if not isinstance(other, Docs):
            raise CompileError(f"expected session.docs(...), got {other!r}")
        shift = self.counter
        inner = other.spec
        alias = inner.tables[0].alias
        if role != "from" and len(inner.tables) != 1:
            raise CompileError("the table of an exists / anti join must be a single table")
        tables = tuple(replace(t, role=role) for t in inner.tables) if role != "from" else inner.tables
        predicates = tuple(
            replace(p, order=p.order + shift, subquery_of=alias if role != "from" else p.subquery_of)
            for p in inner.predicates
        )
        spec = replace(
            self.spec,
            tables=self.spec.tables + tables,
            predicates=self.spec.predicates + predicates,
            equalities=self.spec.equalities + inner.equalities,
            classifies=self.spec.classifies + tuple(replace(c, order=c.order + shift) for c in inner.classifies),
            label_filters=self.spec.label_filters + inner.label_filters,
            scores=self.spec.scores + tuple(replace(s, order=s.order + shift) for s in inner.scores),
            select=self.spec.select + tuple(i for i in inner.select if i.kind == "output"),
        )
        return spec, shift + other.counter

    def _checked(self, spec: QuerySpec, counter: int) -> Docs:
        compile_query(replace(spec, select=(SelectItem("star"), *spec.select)), self.catalog(), partial=True)
        return replace(self, spec=spec, counter=counter)
