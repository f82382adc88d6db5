"""Around the AI calls: the query block that holds them, what each condition reads, the relational tail.

The statement's AI calls live in one SELECT (the *AI block*; the main query, a CTE or a subquery in
FROM). Its conditions are sorted three ways: conditions on one table and no AI call run at that
table's scan; top-level AND-ed AI predicates are planned as model filters and joins; everything
else stays in the *relational tail* — the user's own statement, rewritten by sqlglot for DuckDB with
the AI block's FROM replaced by the model's rows (each alias a relation `__quail_rows_<i>`, aligned
row by row by POSITIONAL JOIN) and each remaining AI call replaced by its output column of `__quail`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from quail.errors import CompileError, GeneralRuleError
from quail.frontend.spec import Where
from quail.frontend.syntax import ai_call, beyond_one_block, fail_at, unsupported, where_of

ROWS_RELATION = "__quail_rows_{}"
OUTPUTS_RELATION = "__quail"
INTERNAL_PREFIX = "__quail"


def rows_relation(index: int) -> str:
    return ROWS_RELATION.format(index)


# -- the AI block ---------------------------------------------------------------------------------


def ai_block(statement: exp.Expression) -> exp.Select:
    """The one SELECT whose expressions hold the statement's AI calls (an EXISTS subquery's belong to
    the query around it); CompileError when there is none, or more than one."""
    owners: list[exp.Select] = []
    for node in statement.walk():
        if ai_call(node) is not None:
            owner = _owner(node)
            if owner is None:
                raise unsupported("an AI function outside a SELECT", node)
            if all(owner is not seen for seen in owners):
                owners.append(owner)
    if not owners:
        raise GeneralRuleError("the query has no AI predicate: use AI_FILTER / AI.IF, AI.CLASSIFY or AI.SCORE")
    if len(owners) > 1:
        raise beyond_one_block("AI functions in two query blocks", owners[1],
                          "write every AI call in one SELECT (the others can read its result as a CTE)")
    return owners[0]


def _owner(node: exp.Expression) -> exp.Select | None:
    select = node.find_ancestor(exp.Select)
    if select is not None and isinstance(select.parent, exp.Exists):
        return select.parent.find_ancestor(exp.Select)
    return select


def visible_ctes(statement: exp.Expression, block: exp.Select) -> list[exp.CTE]:
    """The statement's CTEs the block may read: all of them, or those before the CTE that holds it."""
    with_ = statement.args.get("with_") or statement.args.get("with")
    if with_ is None:
        return []
    ctes = list(with_.expressions)
    for index, cte in enumerate(ctes):
        if cte.this is block or any(node is block for node in cte.walk()):
            return ctes[:index]
    return ctes


def with_clause(ctes: Sequence[exp.CTE], recursive: bool = False) -> str | None:
    """The CTEs as one DuckDB `WITH ...` clause, or None."""
    if not ctes:
        return None
    return exp.With(expressions=[c.copy() for c in ctes], recursive=recursive).sql("duckdb")


# -- what an expression reads ---------------------------------------------------------------------


@dataclass(frozen=True)
class References:
    """The block's aliases an expression reads, and the SELECT-list names it uses (DuckDB lets
    WHERE, GROUP BY, HAVING and ORDER BY name a SELECT item)."""

    aliases: frozenset[str] = frozenset()
    outputs: frozenset[str] = frozenset()


@dataclass
class Scope:
    """The tables of the AI block, by alias in FROM order, with their columns, for name resolution."""

    block: exp.Select
    hidden: set[str] = field(default_factory=set)
    """Aliases of EXISTS subqueries: visible only inside them."""
    outer: set[str] = field(default_factory=set)
    """Aliases of the queries around the block: it cannot read them (it runs once, not per outer row)."""
    tables: dict[str, str] = field(default_factory=dict)
    columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outputs: set[str] = field(default_factory=set)

    def add(self, alias: str, table: str, columns: Sequence[str]) -> None:
        self.tables[alias] = table
        self.columns[alias] = tuple(columns)

    def alias_of(self, column: exp.Column) -> str | None:
        """The block alias a column belongs to; None for a SELECT-list name or a column of an inner query."""
        qualifier = column.table
        if qualifier == OUTPUTS_RELATION:
            return None
        db = column.args.get("db")
        inner = column.find_ancestor(exp.Select) is not self.block
        if db is not None:  # alias.struct_column.field
            return db.name if db.name in self.columns else None
        if qualifier in self.columns:
            self._check_column(qualifier, column)
            return qualifier
        if inner:
            return None
        if qualifier in self.hidden:
            raise fail_at(f"alias {qualifier!r} is only visible inside its EXISTS subquery", column)
        if qualifier in self.outer and qualifier not in self.columns:
            raise beyond_one_block(f"a correlated subquery with AI functions (it reads {qualifier}.{column.name} of "
                              "the query around it)", column, "join that table inside the subquery, or move the "
                              "AI functions to the outer query")
        if qualifier:
            owners = [a for a, names in self.columns.items() if qualifier in names]
            if len(owners) == 1:  # struct_column.field
                return owners[0]
            raise fail_at(f"unknown alias {qualifier!r}; aliases in scope: {', '.join(self.columns)}", column)
        return self._bare(column)

    def _check_column(self, alias: str, column: exp.Column) -> None:
        if isinstance(column.this, exp.Star) or column.name in self.columns[alias]:
            return
        listed = ", ".join(self.columns[alias])
        raise fail_at(f"unknown column {alias}.{column.name}; columns of {self.tables[alias]} ({alias}): {listed}",
                      column)

    def _bare(self, column: exp.Column) -> str | None:
        name = column.name
        matches = [alias for alias, names in self.columns.items() if name in names]
        if len(matches) > 1:
            options = " or ".join(f"{a}.{name}" for a in matches)
            raise fail_at(f"ambiguous column {name!r}: it could be {options}; qualify it", column)
        if matches:
            return matches[0]
        if name in self.outputs:
            return None
        known = ", ".join(f"{a}.{c}" for a, names in self.columns.items() for c in names)
        raise fail_at(f"unknown column {name!r}; columns in scope: {known}", column)

    def references(self, node: exp.Expression) -> References:
        aliases: set[str] = set()
        outputs: set[str] = set()
        for column in node.find_all(exp.Column):
            alias = self.alias_of(column)
            if alias is not None:
                aliases.add(alias)
            elif column.table == OUTPUTS_RELATION or (
                    not column.table and column.find_ancestor(exp.Select) is self.block):
                outputs.add(column.name)
        return References(frozenset(aliases), frozenset(outputs))

    def qualify(self, node: exp.Expression) -> exp.Expression:
        """`node` with every bare column of the block written `alias.column`."""
        def qualified(item: exp.Expression) -> exp.Expression:
            if isinstance(item, exp.Column) and not item.table and not isinstance(item.this, exp.Star):
                alias = self.alias_of(item)
                if alias is not None:
                    return exp.column(item.this.copy(), table=exp.to_identifier(alias))
            return item

        return node.transform(qualified, copy=False)


# -- the relational tail --------------------------------------------------------------------------


def output_column(name: str) -> exp.Column:
    """An AI output in the tail: column `name` of the `__quail` relation."""
    return exp.column(exp.to_identifier(name, quoted=True), table=exp.to_identifier(OUTPUTS_RELATION))


def positional_from(aliases: Sequence[str], with_outputs: bool) -> tuple[exp.From, list[exp.Join]]:
    """FROM the model's rows: one relation per alias and the outputs, aligned row by row."""
    relations: list[exp.Expression] = [
        exp.alias_(exp.to_table(rows_relation(i)), exp.to_identifier(alias), table=True)
        for i, alias in enumerate(aliases)
    ]
    if with_outputs:
        relations.append(exp.alias_(exp.to_table(OUTPUTS_RELATION), OUTPUTS_RELATION, table=True))
    joins = [exp.Join(this=relation, method="POSITIONAL") for relation in relations[1:]]
    return exp.From(this=relations[0]), joins


def projection_statement(columns: Sequence[tuple[str, str | None, str]], aliases: Sequence[str],
                         with_outputs: bool, limit: int | None) -> str:
    """SELECT the named columns — (result name, alias or None for an AI output, column) — FROM the rows."""
    items = []
    for name, alias, column in columns:
        source = output_column(column) if alias is None else exp.column(
            exp.to_identifier(column, quoted=True), table=exp.to_identifier(alias))
        items.append(exp.alias_(source, exp.to_identifier(name, quoted=True)))
    select = exp.Select(expressions=items)
    source, joins = positional_from(aliases, with_outputs)
    select.set("from_", source)
    select.set("joins", joins)
    if limit is not None:
        select.set("limit", exp.Limit(expression=exp.Literal.number(limit)))
    return select.sql("duckdb")


# -- LIMIT: applied early only where it cannot change the answer ----------------------------------

ROW_SHAPING = {"group": "GROUP BY", "having": "HAVING", "order": "ORDER BY", "distinct": "DISTINCT",
               "qualify": "QUALIFY", "windows": "WINDOW"}


def early_limit(statement: exp.Expression, block: exp.Select, residual: bool, tail_joins: bool,
                scan_ordered: bool = False) -> tuple[int | None, str | None]:
    """(rows the model's result may stop at, why not when it may not): sound only when the tail keeps
    every row it gets, in order, and the LIMIT is a number — an ORDER BY too when the scan is numbered in it."""
    limit = block.args.get("limit")
    if limit is None:
        return None, None
    count = _integer(limit.args.get("expression")) if isinstance(limit, exp.Limit) else None
    offset = block.args.get("offset")
    skip = _integer(offset.args.get("expression")) if offset is not None else 0
    reason = _not_early(statement, block, residual, tail_joins, scan_ordered)
    if reason is None and (count is None or skip is None):
        reason = "its count is not a number literal"
    if reason is not None:
        return None, f"LIMIT is applied after the relational part ({reason}): the model answers every row first"
    assert count is not None and skip is not None
    return count + skip, None


def _not_early(statement: exp.Expression, block: exp.Select, residual: bool, tail_joins: bool,
               scan_ordered: bool) -> str | None:
    if statement is not block:
        return "the AI functions sit inside a larger statement"
    for key, name in ROW_SHAPING.items():
        if block.args.get(key) and not (key == "order" and scan_ordered):
            return f"{name} needs every row"
    if residual:
        return "conditions of the relational part remove rows after the model"
    if tail_joins:
        return "a LEFT JOIN of the relational part changes the rows"
    for node in block.expressions:
        if node.find(exp.AggFunc, exp.Window, exp.Unnest, exp.Explode):
            return "an aggregate, window or UNNEST in SELECT needs every row"
    return None


def _integer(node: exp.Expression | None) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        return int(node.this)
    return None


# -- DuckDB's errors, placed in the user's text ---------------------------------------------------

_QUOTED = re.compile(r"\"([^\"]+)\"|'([^']+)'|name (\w+)")


def locate(message: str, node: exp.Expression) -> Where:
    """Where in the user's statement a DuckDB error points: the first column, table or function
    that the message names, else the start of `node`."""
    names = [m.group(1) or m.group(2) or m.group(3) for m in _QUOTED.finditer(message)]
    wanted = [re.split(r"[(.]", name)[-1 if "." in name and "(" not in name else 0].lower() for name in names]
    for name in wanted:
        for item in node.walk():
            if isinstance(item, exp.Column | exp.Table | exp.Func | exp.Identifier) and _named(item) == name:
                where = where_of(item)
                if where.line is not None:
                    return where
    return where_of(node)


def _named(node: exp.Expression) -> str:
    if isinstance(node, exp.Func) and not isinstance(node, exp.Anonymous):
        return node.sql_name().lower()
    return str(node.name).lower()


def relocated(error: CompileError, node: exp.Expression, prefix: str = "") -> CompileError:
    """The DuckDB error as a CompileError at the place in the user's text it is about."""
    where = locate(str(error), node)
    return CompileError(f"{prefix}{error}", line=where.line, column=where.column)


def schema_relations(aliases: Sequence[str], schemas: Mapping[str, object]) -> dict[str, object]:
    """Relation name → schema for the tail's check: each alias's columns, in the order of `aliases`."""
    return {rows_relation(i): schemas[alias] for i, alias in enumerate(aliases)}
