"""QuerySpec + registered tables → a validated logical plan, with one set of checks for both front ends."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from quail.data.providers import TableSchema
from quail.errors import CompileError, GeneralRuleError
from quail.frontend.relational import projection_statement
from quail.frontend.spec import (
    ClassifySpec,
    ColumnName,
    EqualitySpec,
    GenerateSpec,
    PredicateSpec,
    PromptSpec,
    QuerySpec,
    ScoreSpec,
    SelectItem,
    TableSpec,
    VerdictSpec,
    Where,
)
from quail.logical.expressions import AiPredicate, ColumnRef, Equality, Label, OutputColumn, Prompt, Semantics
from quail.logical.nodes import (
    Classify,
    Generate,
    Join,
    LogicalNode,
    Project,
    Scan,
    Score,
    SemanticFilter,
    SemanticJoin,
    Verdict,
)
from quail.schemas import SchemaType

RESERVED_NAMES = frozenset({"predicate", "answer", "margin", "margins", "tokens", "finish"})
"""Column names of the standard answer shapes: no alias or AI output may take them."""


def fail(message: str, where: Where) -> CompileError:
    return CompileError(message, line=where.line, column=where.column)


def compile_query(spec: QuerySpec, catalog: Mapping[str, TableSchema], *, partial: bool = False) -> Project:
    """The un-optimized logical plan: scans with every column, filters above the joins.

    `partial` checks a query still being built, which may not have its AI predicate yet.
    """
    return _Compiler(spec, catalog, partial).compile()


@dataclass(frozen=True)
class _Resolved:
    predicate: AiPredicate
    spec: PredicateSpec


@dataclass(frozen=True)
class _Output:
    """A resolved AI.CLASSIFY / AI.SCORE, waiting for the plan it will sit on."""

    position: int
    output: str
    prompt: Prompt
    attach: Callable[[LogicalNode], LogicalNode]
    kind: str = "output"


class _Compiler:
    def __init__(self, spec: QuerySpec, catalog: Mapping[str, TableSchema], partial: bool) -> None:
        self.spec = spec
        self.partial = partial
        self.catalog = catalog
        self.tables: dict[str, TableSpec] = {}
        self.positions = _positions(spec)
        self.scan_conditions: dict[str, list[str]] = {}
        for condition in spec.scan:
            self.scan_conditions.setdefault(condition.alias, []).append(condition.sql)

    # -- the whole pipeline -------------------------------------------------------------------

    def compile(self) -> Project:
        self._check_tables()
        if not self.positions and not self.partial:
            raise GeneralRuleError("the query has no AI predicate: use AI_FILTER / AI.IF, AI.CLASSIFY or AI.SCORE")
        predicates = [self._predicate(p) for p in self.spec.predicates]
        outputs = [self._classify(c) for c in self.spec.classifies] + [self._score(s) for s in self.spec.scores]
        outputs += [self._verdict(v) for v in self.spec.verdicts] + [self._generate(g) for g in self.spec.generates]
        self._check_document_columns([p.predicate.prompt for p in predicates] + [o.prompt for o in outputs])
        equalities = [(self._equality(e), e) for e in self.spec.equalities]
        tree = self._join_tree(predicates, equalities)
        tree = self._stack_filters(tree, predicates)
        tree = self._stack_outputs(tree, outputs)
        return self._project(tree, outputs)

    def _project(self, tree: LogicalNode, outputs: list[_Output]) -> Project:
        """The root: the statement the compiler writes for a plain projection, or the SQL front end's tail."""
        self._check_output_names(outputs)
        relational = self.spec.relational
        if relational is None:
            columns = self._select(outputs)
            named = [(c.name, c.source.alias if c.source else None, c.source.column if c.source else c.name)
                     for c in columns]
            statement = projection_statement(named, self.output_aliases, any(c.source is None for c in columns),
                                             self._limit())
            return Project(tree, columns, self._limit(), statement, tuple(self.output_aliases), self.spec.remarks,
                           self.spec.pair_conditions)
        reads = [self.resolve(name, self.output_aliases) for name in relational.reads]
        columns = tuple(self._column_output(r.alias, r.column) for r in reads) + tuple(
            OutputColumn(name) for name in relational.outputs)
        return Project(tree, columns, self._limit(), relational.statement, relational.relations,
                       (*relational.remarks, *self.spec.remarks), self.spec.pair_conditions)

    # -- tables and names ---------------------------------------------------------------------

    def _check_tables(self) -> None:
        if not self.spec.tables:
            raise CompileError("the query reads no table")
        for table in self.spec.tables:
            if table.schema is None and table.table not in self.catalog:
                known = ", ".join(sorted(self.catalog)) or "none"
                raise fail(f"unknown table {table.table!r}; registered tables: {known}", table.where)
            if table.alias in self.tables:
                raise fail(f"alias {table.alias!r} is used for two tables", table.where)
            if table.alias in RESERVED_NAMES:
                raise fail(f"alias {table.alias!r} is reserved for answer columns; pick another alias "
                           f"(reserved: {', '.join(sorted(RESERVED_NAMES))})", table.where)
            self.tables[table.alias] = table

    @property
    def from_aliases(self) -> list[str]:
        return [a for a, t in self.tables.items() if t.role == "from"]

    @property
    def output_aliases(self) -> list[str]:
        """The aliases whose rows reach the result: FROM / JOIN tables and LEFT JOINed ones, in order."""
        return [a for a, t in self.tables.items() if t.role in ("from", "left")]

    def schema(self, alias: str) -> TableSchema:
        table = self.tables[alias]
        return table.schema or self.catalog[table.table]

    def _scope(self, subquery_of: str | None) -> list[str]:
        return self.from_aliases + ([subquery_of] if subquery_of else [])

    def resolve(self, name: ColumnName, scope: Sequence[str]) -> ColumnRef:
        if name.qualifier is not None:
            return self._qualified(name, scope)
        matches = [a for a in scope if name.name in self.schema(a).columns]
        if not matches:
            known = ", ".join(f"{a}.{c}" for a in scope for c in self.schema(a).columns)
            raise fail(f"unknown column {name.name!r}; columns in scope: {known}", name.where)
        if len(matches) > 1:
            options = " or ".join(f"{a}.{name.name}" for a in matches)
            raise fail(f"ambiguous column {name.name!r}: it could be {options}; qualify it", name.where)
        return ColumnRef(matches[0], name.name)

    def _qualified(self, name: ColumnName, scope: Sequence[str]) -> ColumnRef:
        alias = name.qualifier or ""
        if alias not in self.tables:
            raise fail(f"unknown alias {alias!r}; aliases in scope: {', '.join(scope)}", name.where)
        if alias not in scope:
            raise fail(f"alias {alias!r} is only visible inside its EXISTS subquery", name.where)
        schema = self.schema(alias)
        if name.name not in schema.columns:
            raise fail(
                f"unknown column {alias}.{name.name}; columns of {schema.name} ({alias}): {', '.join(schema.columns)}",
                name.where,
            )
        return ColumnRef(alias, name.name)

    # -- AI items -----------------------------------------------------------------------------

    def _prompt(self, spec: PromptSpec, scope: Sequence[str]) -> Prompt:
        columns = tuple(self.resolve(a, scope) for a in spec.arguments)
        prompt = Prompt(spec.template, columns, spec.examples, spec.symmetric)
        _check_placeholders(prompt, spec.where)
        if prompt.symmetric and len(set(prompt.aliases)) != 2:
            raise fail("'symmetric' is for a prompt over two documents of two tables, {0} and {1}; this one reads "
                       f"{len(prompt.columns)} column(s) of {', '.join(sorted(set(prompt.aliases)))}", spec.where)
        if prompt.examples and len(set(prompt.aliases)) > 1:
            raise fail("examples are given for a prompt over one document; this one reads "
                       f"{', '.join(sorted(set(prompt.aliases)))}", spec.where)
        return prompt

    def _predicate(self, spec: PredicateSpec) -> _Resolved:
        prompt = self._prompt(spec.prompt, self._scope(spec.subquery_of))
        if spec.selectivity is not None and not 0.0 <= spec.selectivity <= 1.0:
            raise fail(f"selectivity must be a number in [0, 1], got {spec.selectivity!r}", spec.where)
        if spec.threshold is not None and not 0.0 <= spec.threshold.value <= 1.0:
            raise fail(f"AI.SCORE compares against a number in [0, 1], got {spec.threshold.value!r}", spec.where)
        self._check_anchor(spec, prompt)
        if spec.subquery_of is not None and spec.subquery_of not in prompt.aliases:
            raise fail(
                f"a predicate inside EXISTS must read the subquery's table {spec.subquery_of!r}", spec.where
            )
        predicate = AiPredicate(prompt, self.positions[("predicate", spec.order)], spec.selectivity,
                                spec.anchor, spec.threshold)
        return _Resolved(predicate, spec)

    def _check_anchor(self, spec: PredicateSpec, prompt: Prompt) -> None:
        if spec.anchor is None:
            return
        if len(prompt.aliases) < 2:
            raise fail(f"anchor {spec.anchor!r} is outside its join: this predicate reads only "
                       f"{prompt.aliases[0]!r} and joins nothing", spec.where)
        if spec.anchor not in prompt.aliases:
            raise fail(f"anchor {spec.anchor!r} is outside its join: the predicate joins "
                       f"{', '.join(prompt.aliases)}", spec.where)

    def _classify(self, spec: ClassifySpec) -> _Output:
        prompt = self._prompt(spec.prompt, self.output_aliases)
        if len(prompt.aliases) != 1:
            raise fail("AI.CLASSIFY reads the documents of exactly one table", spec.where)
        names = [label.name for label in spec.labels]
        if len(names) < 2:
            raise fail("AI.CLASSIFY needs at least two labels", spec.where)
        if len(set(names)) != len(names):
            raise fail(f"AI.CLASSIFY labels must be distinct: {', '.join(names)}", spec.where)
        allowed = self._allowed_labels(spec.output, names)
        position = self.positions[("classify", spec.order)]
        attach = partial(_classify_node, prompt=prompt, labels=spec.labels, output=spec.output, position=position,
                         allowed=allowed, instructions=spec.instructions)
        return _Output(position, spec.output, prompt, attach)

    def _allowed_labels(self, output: str, names: list[str]) -> tuple[str, ...] | None:
        filters = [f for f in self.spec.label_filters if f.output == output]
        if not filters:
            return None
        allowed = set(names)
        for label_filter in filters:
            for value in label_filter.allowed:
                if value not in names:
                    raise fail(f"{value!r} is not a label of {output}: {', '.join(names)}", label_filter.where)
            allowed &= set(label_filter.allowed)
        return tuple(n for n in names if n in allowed)

    def _score(self, spec: ScoreSpec) -> _Output:
        prompt = self._prompt(spec.prompt, self.output_aliases)
        if len(prompt.aliases) != 1:
            raise fail("AI.SCORE as a value reads the documents of exactly one table; compare it with a number "
                       "in WHERE or ON to join tables", spec.where)
        position = self.positions[("score", spec.order)]
        return _Output(position, spec.output, prompt,
                       partial(_score_node, prompt=prompt, output=spec.output, position=position))

    def _generate(self, spec: GenerateSpec) -> _Output:
        prompt = self._prompt(spec.prompt, self.output_aliases)
        if len(prompt.aliases) != 1:
            raise fail("AI.GENERATE / AI_COMPLETE reads the documents of exactly one table", spec.where)
        position = self.positions[("generate", spec.order)]
        return _Output(position, spec.output, prompt, partial(_generate_node, prompt=prompt, output=spec.output,
                                                              position=position, max_tokens=spec.max_tokens,
                                                              schema=spec.schema))

    def _verdict(self, spec: VerdictSpec) -> _Output:
        prompt = self._prompt(spec.prompt, self.output_aliases)
        if len(prompt.aliases) != 1:
            raise GeneralRuleError("an AI predicate over two tables stands at the top level of WHERE or ON (AND-ed); "
                                   "as a value (in OR, NOT, CASE, SELECT, ...) AI_FILTER reads one table",
                                   line=spec.where.line, column=spec.where.column)
        if spec.selectivity is not None and not 0.0 <= spec.selectivity <= 1.0:
            raise fail(f"selectivity must be a number in [0, 1], got {spec.selectivity!r}", spec.where)
        position = self.positions[("verdict", spec.order)]
        return _Output(position, spec.output, prompt, partial(_verdict_node, prompt=prompt, output=spec.output,
                                                              position=position, selectivity=spec.selectivity))

    def _check_document_columns(self, prompts: list[Prompt]) -> None:
        seen: dict[str, ColumnRef] = {}
        for prompt in prompts:
            for column in prompt.columns:
                earlier = seen.setdefault(column.alias, column)
                if earlier != column:
                    raise GeneralRuleError(
                        f"two document columns on one alias: {earlier} and {column}; each table "
                        "contributes one document column to its prompts"
                    )

    def _equality(self, spec: EqualitySpec) -> Equality:
        left, right = self.resolve(spec.left, self._scope(spec.subquery_of)), self.resolve(
            spec.right, self._scope(spec.subquery_of))
        if left.alias == right.alias:
            raise fail(f"{left} = {right} compares columns of one table; only equalities between "
                       "two tables are supported", spec.where)
        return Equality(left, right)

    # -- the join tree ------------------------------------------------------------------------

    def _scan(self, alias: str) -> Scan:
        schema, table = self.schema(alias), self.tables[alias]
        conditions = self.scan_conditions.get(alias, [])
        where = " AND ".join(f"({c})" for c in conditions) if len(conditions) > 1 else (conditions or [None])[0]
        order = self.spec.scan_order[1] if self.spec.scan_order and self.spec.scan_order[0] == alias else None
        return Scan(table.table, alias, schema.id_column, schema.columns, where, table.source,
                    self.spec.ctes if (where or table.source) else None, order)

    def _join_tree(self, predicates: list[_Resolved],
                   equalities: list[tuple[Equality, EqualitySpec]]) -> LogicalNode:
        joins = [p for p in predicates if len(p.predicate.aliases) > 1 and p.spec.subquery_of is None]
        self._check_on_clauses(joins, equalities)
        order = self.from_aliases
        _check_connected(order, joins, equalities, self.spec.links)
        tree: LogicalNode = self._scan(order[0])
        joined = {order[0]}
        for alias in order[1:]:
            tree = self._join_step(tree, alias, joined, joins, equalities)
            joined.add(alias)
        for alias, table in self.tables.items():
            if table.role != "from":
                tree = self._subquery_join(tree, alias, predicates, equalities)
        return tree

    def _check_on_clauses(self, joins: list[_Resolved], equalities: list[tuple[Equality, EqualitySpec]]) -> None:
        order = self.from_aliases
        for resolved in joins:
            on_of = resolved.spec.on_of
            if on_of is None:
                continue
            visible = set(order[: order.index(on_of) + 1])
            late = [a for a in resolved.predicate.aliases if a not in visible]
            if late:
                raise fail(f"the ON clause of {on_of!r} refers to {late[0]!r}, which is joined later",
                           resolved.spec.where)
        for equality, spec in equalities:
            if spec.on_of is not None:
                visible = set(order[: order.index(spec.on_of) + 1])
                late = [a for a in equality.aliases if a not in visible]
                if late:
                    raise fail(f"the ON clause of {spec.on_of!r} refers to {late[0]!r}, which is joined later",
                               spec.where)

    def _join_step(self, tree: LogicalNode, alias: str, joined: set[str], joins: list[_Resolved],
                   equalities: list[tuple[Equality, EqualitySpec]]) -> LogicalNode:
        now = joined | {alias}
        completing = [j for j in joins if alias in j.predicate.aliases and set(j.predicate.aliases) <= now]
        restricting = tuple(e for e, _ in equalities if alias in e.aliases and set(e.aliases) <= now)
        if len(completing) > 1:
            first, second = completing[0], completing[1]
            same_on = first.spec.on_of is not None and first.spec.on_of == second.spec.on_of
            what = "two AI predicates in one ON clause" if same_on else "two AI predicates join the same tables"
            raise fail(f"{what} ({first.predicate.describe()} and {second.predicate.describe()}); "
                       "a join takes one AI predicate", second.spec.where)
        if completing:
            return SemanticJoin(tree, self._scan(alias), completing[0].predicate, "full", restricting)
        return Join(tree, self._scan(alias), restricting)

    def _subquery_join(self, tree: LogicalNode, alias: str, predicates: list[_Resolved],
                       equalities: list[tuple[Equality, EqualitySpec]]) -> LogicalNode:
        table = self.tables[alias]
        inside = [p for p in predicates if p.spec.subquery_of == alias]
        joining = [p for p in inside if len(p.predicate.aliases) > 1]
        if len(joining) != 1:
            where = "a LEFT JOIN ... ON" if table.role == "left" else "an EXISTS subquery"
            raise GeneralRuleError(f"{where} needs exactly one AI predicate that reads both {alias!r} and an "
                                   f"outer table; found {len(joining)}", line=table.where.line,
                                   column=table.where.column)
        inner: LogicalNode = self._scan(alias)
        filters = tuple(p.predicate for p in inside if len(p.predicate.aliases) == 1)
        if filters:
            inner = SemanticFilter(inner, alias, filters)
        predicate = joining[0].predicate
        if predicate.anchor is None and table.role != "left":
            outer = next(a for a in predicate.aliases if a != alias)
            predicate = AiPredicate(predicate.prompt, predicate.position, predicate.selectivity, outer,
                                    predicate.threshold)
        restricting = tuple(e for e, _ in equalities if alias in e.aliases)
        semantics: Semantics = "exists" if table.role == "exists" else "anti" if table.role == "anti" else "left"
        conditions = tuple(c for joined, c in self.spec.left_conditions if joined == alias)
        return SemanticJoin(tree, inner, predicate, semantics, restricting, conditions)

    def _stack_filters(self, tree: LogicalNode, predicates: list[_Resolved]) -> LogicalNode:
        by_alias: dict[str, list[AiPredicate]] = {}
        for resolved in predicates:
            if len(resolved.predicate.aliases) == 1 and resolved.spec.subquery_of is None:
                by_alias.setdefault(resolved.predicate.aliases[0], []).append(resolved.predicate)
        for alias in self.from_aliases:
            if alias in by_alias:
                tree = SemanticFilter(tree, alias, tuple(sorted(by_alias[alias], key=lambda p: p.position)))
        return tree

    @staticmethod
    def _stack_outputs(tree: LogicalNode, outputs: list[_Output]) -> LogicalNode:
        for item in sorted(outputs, key=lambda pending: pending.position):
            tree = item.attach(tree)
        return tree

    # -- output -------------------------------------------------------------------------------

    def _check_output_names(self, items: list[_Output]) -> None:
        outputs = {node.output for node in items}
        for name in outputs:
            if not name.isidentifier():
                raise CompileError(f"AI output name {name!r} is not an identifier")
            if name in RESERVED_NAMES or name in self.tables:
                what = "a table alias" if name in self.tables else "reserved for answer columns"
                raise CompileError(f"AI output name {name!r} is {what}; pick another name")
        if len(outputs) != len(items):
            raise CompileError("two AI outputs share one name; give each AI.CLASSIFY / AI.SCORE its own AS name")
        classifies = {c.output for c in self.spec.classifies}
        for label_filter in self.spec.label_filters:
            if label_filter.output not in classifies:
                raise fail(f"{label_filter.output!r} in WHERE ... IN (...) names no AI.CLASSIFY output",
                           label_filter.where)

    def _select(self, items: list[_Output]) -> tuple[OutputColumn, ...]:
        outputs = {node.output for node in items}
        columns: list[OutputColumn] = []
        for item in self.spec.select:
            columns.extend(self._select_item(item, outputs))
        return tuple(columns)

    def _select_item(self, item: SelectItem, outputs: set[str]) -> list[OutputColumn]:
        if item.kind == "star":
            return [self._column_output(a, c) for a in self.output_aliases for c in self.schema(a).columns]
        if item.kind == "alias_star":
            alias = item.alias or ""
            first = self.schema(alias).columns[0] if alias in self.tables else ""
            self._qualified(ColumnName(alias, first, item.where), self.output_aliases)
            return [self._column_output(alias, c) for c in self.schema(alias).columns]
        if item.kind == "output":
            return [OutputColumn(item.output or "")]
        assert item.column is not None
        if item.column.qualifier is None and item.column.name in outputs:
            return [OutputColumn(item.column.name)]
        ref = self.resolve(item.column, self.output_aliases)
        return [self._column_output(ref.alias, ref.column)]

    @staticmethod
    def _column_output(alias: str, column: str) -> OutputColumn:
        """`r.id` is named `id` in the result, as DuckDB, BigQuery and Snowflake name it."""
        return OutputColumn(column, ColumnRef(alias, column))

    def _limit(self) -> int | None:
        if self.spec.limit is not None and self.spec.limit < 0:
            raise CompileError(f"LIMIT must not be negative, got {self.spec.limit}")
        return self.spec.limit


def _classify_node(child: LogicalNode, *, prompt: Prompt, labels: tuple[Label, ...], output: str, position: int,
                   allowed: tuple[str, ...] | None, instructions: str | None) -> Classify:
    return Classify(child, prompt, labels, output, position, allowed, instructions)


def _score_node(child: LogicalNode, *, prompt: Prompt, output: str, position: int) -> Score:
    return Score(child, prompt, output, position)


def _generate_node(child: LogicalNode, *, prompt: Prompt, output: str, position: int, max_tokens: int,
                   schema: SchemaType | None) -> Generate:
    return Generate(child, prompt, output, position, max_tokens, schema)


def _verdict_node(child: LogicalNode, *, prompt: Prompt, output: str, position: int,
                  selectivity: float | None) -> Verdict:
    return Verdict(child, prompt, output, position, selectivity)


def _positions(spec: QuerySpec) -> dict[tuple[str, int], int]:
    """Written position of every AI item: its rank in the order the query wrote them."""
    keyed = [("predicate", p.order) for p in spec.predicates]
    keyed += [("classify", c.order) for c in spec.classifies]
    keyed += [("score", s.order) for s in spec.scores]
    keyed += [("verdict", v.order) for v in spec.verdicts]
    keyed += [("generate", g.order) for g in spec.generates]
    return {key: index for index, key in enumerate(sorted(keyed, key=lambda k: k[1]))}


def _check_placeholders(prompt: Prompt, where: Where) -> None:
    numbers = prompt.placeholder_numbers()
    count = len(prompt.columns)
    if count == 0:
        raise fail("PROMPT needs at least one column argument after its template", where)
    repeated = next((n for n in numbers if numbers.count(n) > 1), None)
    if repeated is not None:
        raise fail(f"placeholder {{{repeated}}} appears more than once in the PROMPT template", where)
    extra = sorted(n for n in numbers if n >= count)
    if extra:
        raise fail(f"placeholder {{{extra[0]}}} has no column: PROMPT gives {count} column argument(s)", where)
    missing = [n for n in range(count) if n not in numbers]
    if missing:
        raise fail(f"PROMPT column argument {prompt.columns[missing[0]]} has no placeholder {{{missing[0]}}} "
                   "in the template", where)
    aliases = prompt.aliases
    twice = next((a for a in aliases if aliases.count(a) > 1), None)
    if twice is not None:
        raise GeneralRuleError(f"PROMPT reads table alias {twice!r} in two placeholders; each placeholder must "
                               "come from a different table", line=where.line, column=where.column)


def _check_connected(order: list[str], joins: list[_Resolved], equalities: list[tuple[Equality, EqualitySpec]],
                     links: Sequence[Sequence[str]] = ()) -> None:
    parent = {a: a for a in order}

    def root(alias: str) -> str:
        while parent[alias] != alias:
            alias = parent[alias]
        return alias

    groups = [list(j.predicate.aliases) for j in joins] + [list(e.aliases) for e, _ in equalities]
    groups += [list(link) for link in links]
    for group in groups:
        members = [a for a in group if a in parent]
        for other in members[1:]:
            parent[root(other)] = root(members[0])
    lonely = [a for a in order if root(a) != root(order[0])]
    if lonely:
        raise GeneralRuleError(f"table {lonely[0]!r} is not connected to {order[0]!r} by any condition; a cross "
                           "product of documents needs an AI predicate or a condition over both tables")
