"""Writing the relational tail: the user's statement, rewritten in place for DuckDB.

The AI block's FROM becomes the model's rows (one positional relation per alias, and `__quail` for
the AI outputs, `relational.positional_from`), its WHERE keeps only the conditions nothing below ran,
every remaining AI call becomes the value the reader gives it (an output column, or TRUE where WHERE
already holds it), bare columns are qualified, and `*` is expanded to the tables' own columns — so
the statement's shape, and everything outside the AI block, is the user's, and DuckDB runs it all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from quail.frontend.calls import is_plain_column
from quail.frontend.relational import Scope, positional_from
from quail.frontend.spec import ColumnName
from quail.frontend.syntax import AiCall, Dialect, ai_call, ai_calls, beyond_one_block, fail_at, safe_sql, unsupported

CLAUSES = ("group", "having", "qualify", "order", "windows")


@dataclass
class TailWriter:
    statement: exp.Expression
    block: exp.Select
    scope: Scope
    dialect: Dialect
    value_of: Callable[[AiCall], exp.Expression]
    """What an AI call of the block reads as in the tail."""

    def write(self, residual: Sequence[exp.Expression], model_aliases: Sequence[str], tail_aliases: Sequence[str],
              tail_joins: Sequence[exp.Join], with_outputs: Callable[[], bool]) -> str:
        """The whole statement for DuckDB; `with_outputs` is asked once every AI call has its value."""
        block = self.block
        top = block is self.statement
        items: list[exp.Expression] = []
        for item in block.expressions:
            items.extend(self._items(item, top, [*model_aliases, *tail_aliases]))
        block.set("expressions", items)
        kept = [self.rewrite(node) for node in residual]
        block.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
        for key in CLAUSES:
            value = block.args.get(key)
            if isinstance(value, exp.Expression):
                block.set(key, self.rewrite(value))
            elif isinstance(value, list):
                block.set(key, [self.rewrite(v) for v in value])
        for join in tail_joins:
            on = join.args.get("on")
            if on is not None:
                join.set("on", self.scope.qualify(on))
        source, joins = positional_from(model_aliases, with_outputs())
        block.set("from_", source)
        block.set("from", None)
        block.set("joins", [*joins, *tail_joins])
        return self.statement.sql(dialect="duckdb")

    def rewrite(self, node: exp.Expression) -> exp.Expression:
        """`node`, in place (still inside the block, so names resolve): AI calls replaced by their values,
        bare columns qualified by their alias; an unknown name is refused here, with its position."""
        def swap(item: exp.Expression) -> exp.Expression:
            call = ai_call(item)
            if call is None:
                return item
            if call.node.find_ancestor(exp.Select) is not self.block:
                raise beyond_one_block(f"{call.spelling} inside a subquery", call.node,
                                  "AI functions stand in the query block's own clauses, or in a top-level "
                                  "[NOT] EXISTS (SELECT ... WHERE AI_FILTER(...))")
            return self.value_of(call)

        replaced = node.transform(swap, copy=False)
        self.scope.references(replaced)
        return self.scope.qualify(replaced)

    def reads(self, model_aliases: Sequence[str]) -> tuple[ColumnName, ...]:
        """The table columns of the model's aliases the rewritten statement reads, in order of appearance."""
        seen: dict[tuple[str, str], ColumnName] = {}
        for column in self.block.find_all(exp.Column):
            alias = column.table
            if alias in model_aliases and not isinstance(column.this, exp.Star) and (
                    column.name in self.scope.columns[alias]):
                seen.setdefault((alias, column.name), ColumnName(alias, column.name))
        return tuple(seen.values())

    def _items(self, item: exp.Expression, top: bool, star_aliases: Sequence[str]) -> list[exp.Expression]:
        """A SELECT item for the tail: named by its column (a plain column, as DuckDB, BigQuery and Snowflake
        name it) or by its own text (an AI value) at the top of the statement."""
        star = item if isinstance(item, exp.Star) else (
            item.this if isinstance(item, exp.Column) and isinstance(item.this, exp.Star) else None)
        if star is not None:
            return self._expanded(item, star, top, star_aliases)
        text = safe_sql(item, self.dialect)
        rewritten = self.rewrite(item)
        if not top or isinstance(item, exp.Alias):
            return [rewritten]
        if ai_calls(item):
            return [exp.alias_(rewritten, exp.to_identifier(text, quoted=True))]
        if isinstance(rewritten, exp.Column) and rewritten.table and is_plain_column(rewritten):
            return [exp.alias_(rewritten, exp.to_identifier(rewritten.name, quoted=True))]  # `id`, as DuckDB names it
        return [rewritten]

    def _expanded(self, item: exp.Expression, star: exp.Star, top: bool,
                  star_aliases: Sequence[str]) -> list[exp.Expression]:
        """`*` / `alias.*` (with EXCLUDE / EXCEPT) as the tables' own columns: the tail's FROM has more."""
        for key in ("replace", "rename", "ilike"):
            if star.args.get(key):
                raise unsupported(f"SELECT * {key.upper()} in the query block with AI functions", item,
                                  "list the columns")
        excluded = {c.name for c in star.args.get("except_") or []}
        aliases = [item.table] if isinstance(item, exp.Column) else list(star_aliases)
        expanded: list[exp.Expression] = []
        for alias in aliases:
            if alias not in self.scope.columns:
                raise fail_at(f"unknown alias {alias!r}; aliases in scope: {', '.join(self.scope.columns)}", item)
            for name in self.scope.columns[alias]:
                if name in excluded:
                    continue
                column = exp.column(exp.to_identifier(name, quoted=True), table=exp.to_identifier(alias))
                expanded.append(exp.alias_(column, exp.to_identifier(name, quoted=True)))
        return expanded
