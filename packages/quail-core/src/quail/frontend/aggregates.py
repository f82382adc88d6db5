"""Snowflake's AI aggregates — `AI_AGG(expr, instruction)` and `AI_SUMMARIZE_AGG(expr)` — as lookups over groups.

An AI aggregate answers once per group of rows: its value is the model's answer to the instruction over the group's
texts. The statement keeps its own grouping: each call is replaced by a scalar subquery that reads the answer of
the group's texts, `(SELECT l.v FROM <lookup> l WHERE l.k IS NOT DISTINCT FROM LIST(expr ...))` — DuckDB evaluates
the LIST in the group's context. The groups themselves come from the call's own block with its SELECT list made
that LIST (`groups`), so the model answers each distinct group once, before the statement runs
(`quail.runtime.aggregates` reduces a group larger than the context in rounds).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sqlglot import exp

from quail.frontend.syntax import fail_at, safe_sql, unsupported

AGGREGATE_NAMES = ("AI_AGG", "AI_SUMMARIZE_AGG")
SUMMARY = "Summarize these texts in a few sentences."
"""AI_SUMMARIZE_AGG's instruction: Snowflake's function takes none."""
DROPPED = ("order", "limit", "offset", "having", "qualify", "distinct", "windows")
"""Clauses of the call's block that do not change which groups exist (HAVING may keep fewer: a superset is asked)."""


@dataclass(frozen=True)
class Aggregate:
    name: str
    """The relation of its answers (k: a group's texts, v: the answer) while the statement runs."""
    call: str
    """As the user wrote it, for explain()."""
    instruction: str
    groups: str
    """DuckDB SQL of the distinct groups' texts (column k, list<varchar>)."""


def is_aggregate(node: exp.Expression) -> bool:
    """sqlglot reads both as its own nodes (AIAgg, AISummarizeAgg); a spelling it does not know is Anonymous."""
    return isinstance(node, exp.Func) and _name(node) in AGGREGATE_NAMES


def _name(node: exp.Func) -> str:
    return str(node.name).upper() if isinstance(node, exp.Anonymous) else node.sql_name().upper()


def has_aggregates(statement: exp.Expression) -> bool:
    return any(is_aggregate(node) for node in statement.walk())


def aggregates(statement: exp.Expression, prefix: str, counter: itertools.count) -> tuple[list[Aggregate],
                                                                                          exp.Expression]:
    """Every AI aggregate of a statement with no other AI call left, made a lookup named `{prefix}{n}`, and the
    statement reading them."""
    statement = statement.copy()
    found: list[Aggregate] = []
    for node in [n for n in statement.walk() if is_aggregate(n)]:
        block = node.find_ancestor(exp.Select)
        if block is None:
            raise fail_at(f"{_name(node)} outside a SELECT", node)
        text, instruction = _arguments(node)
        name = f"{prefix}{next(counter)}"
        found.append(Aggregate(name, safe_sql(node), instruction, _groups(statement, block, text)))
        node.replace(_reading(name, text))
    return found, statement


def _arguments(node: exp.Func) -> tuple[exp.Expression, str]:
    name = _name(node)
    arguments = list(node.expressions) if isinstance(node, exp.Anonymous) else [
        v for v in (node.args.get("this"), node.args.get("expression")) if v is not None]
    wanted = 2 if name == "AI_AGG" else 1
    if len(arguments) != wanted or any(isinstance(a, exp.Kwarg) for a in arguments):
        form = "AI_AGG(texts, 'instruction')" if name == "AI_AGG" else "AI_SUMMARIZE_AGG(texts)"
        raise unsupported(f"{name} with these arguments", node, f"write {form}")
    if name == "AI_SUMMARIZE_AGG":
        return arguments[0], SUMMARY
    instruction = arguments[1]
    if not (isinstance(instruction, exp.Literal) and instruction.is_string) or not str(instruction.this).strip():
        raise unsupported(f"AI_AGG instruction {safe_sql(instruction)}", instruction, "the instruction is a string")
    if "{" in instruction.this or "}" in instruction.this:
        raise fail_at("the AI_AGG instruction has braces; write it without them", instruction)
    return arguments[0], str(instruction.this)


def texts_of(text: exp.Expression) -> exp.Expression:
    """The group's texts in a fixed order, NULLs left out: the lookup's key, computed alike on both sides."""
    value = exp.cast(text.copy(), "VARCHAR")
    ordered = exp.Order(expressions=[exp.Ordered(this=value.copy())])
    listed = exp.Anonymous(this="LIST", expressions=[exp.Order(this=value, expressions=ordered.expressions)])
    return exp.Filter(this=listed, expression=exp.Where(this=exp.Not(this=exp.Is(this=text.copy(),
                                                                                  expression=exp.Null()))))


def _reading(name: str, text: exp.Expression) -> exp.Expression:
    relation = exp.alias_(exp.to_table(name), "l", table=True)
    match = exp.NullSafeEQ(this=exp.column("k", table="l"), expression=texts_of(text))
    return exp.Subquery(this=exp.select(exp.column("v", table="l")).from_(relation).where(match))


def _groups(statement: exp.Expression, block: exp.Select, text: exp.Expression) -> str:
    """The call's block asked for the distinct groups' texts, with the statement's CTEs in front."""
    groups = block.copy()
    for key in DROPPED:
        groups.set(key, None)
    groups.set("expressions", [exp.alias_(texts_of(text), "k")])
    query = exp.select("k").distinct().from_(exp.alias_(exp.Subquery(this=groups), "g", table=True))
    with_ = statement.args.get("with_") or statement.args.get("with")
    if isinstance(with_, exp.With) and block is not statement:
        query.set("with_", with_.copy())
    return query.sql(dialect="duckdb")
