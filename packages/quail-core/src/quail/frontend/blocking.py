"""Similarity blocking of an AI join: `JOIN t ON AI_FILTER(PROMPT('… {0} … {1}', a.x, b.y), {'blocking': 'top_k',
'k': 20})` asks the model only about the pairs whose texts are close in an embedding space.

The call names the two documents it compares; blocking embeds each table's distinct texts once, keeps for every
text of `{0}` its `k` most similar texts of `{1}` (or every pair above a cosine `similarity`), and the statement then
reads those pairs as a table joined by equality between the two tables — so the ordinary planner of one block
plans the join with the pairs as its candidates (the model judges nothing else) and every other part of the
statement stays as written. This module finds the blocked calls and rewrites the statement; `runtime.blocking`
computes the pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlglot import exp

from quail.frontend.calls import number, struct_field
from quail.frontend.lookups import block_sources
from quail.frontend.syntax import AiCall, ai_call, ai_calls, conjuncts, fail_at, safe_sql, unsupported

BlockingMode = Literal["top_k", "threshold"]
MODES: tuple[BlockingMode, ...] = ("top_k", "threshold")
EMBEDDING_MODEL_OPTION = "embedding_model"
"""The blocking option naming the embedding model (the call's own `model` is the model that judges the pairs)."""
OPTIONS = frozenset({"blocking", "k", "similarity", EMBEDDING_MODEL_OPTION})
MAX_K = 10_000
LEFT, RIGHT = "l", "r"
"""The registered pairs relation's columns: a text of `{0}` and a text of `{1}`."""
MAX_THRESHOLD_PAIRS = 10_000_000
"""Pairs a similarity threshold may keep: beyond it the threshold asks nearly every pair, and says so."""


@dataclass(frozen=True)
class PairsRelation:
    """The blocked pairs as a statement reads them: a derived table over the registered relation `name`, its alias
    and columns named after it, so no name of the user's statement can collide with them."""

    name: str

    @property
    def suffix(self) -> str:
        return self.name.rsplit("_", 1)[-1]

    @property
    def alias(self) -> str:
        return f"quail_pairs_{self.suffix}"

    @property
    def left(self) -> str:
        return f"quail_l_{self.suffix}"

    @property
    def right(self) -> str:
        return f"quail_r_{self.suffix}"

    def table(self) -> exp.Expression:
        select = exp.select(exp.alias_(exp.column(LEFT), self.left), exp.alias_(exp.column(RIGHT), self.right))
        return exp.Subquery(this=select.from_(exp.to_table(self.name)),
                            alias=exp.TableAlias(this=exp.to_identifier(self.alias)))

    def column(self, side: str) -> exp.Column:
        return exp.column(self.left if side == LEFT else self.right, table=self.alias)


@dataclass(frozen=True)
class BlockedJoin:
    """One AI join call with a blocking option: its two documents and how their pairs are chosen."""

    call: str
    """The call as written, for explain()."""
    condition: exp.Expression
    """The call without its blocking options: the join condition the model judges."""
    left: exp.Column
    """The document of `{0}`: every one of its texts keeps its nearest texts of `right`."""
    right: exp.Column
    left_table: exp.Expression
    right_table: exp.Expression
    left_conditions: tuple[exp.Expression, ...]
    """The top-level WHERE conditions of the call's block on `{0}`'s table alone: its texts are those of the rows
    they keep (blocking chooses among the texts the join can meet)."""
    right_conditions: tuple[exp.Expression, ...]
    mode: BlockingMode
    k: int | None
    similarity: float | None
    model: str | None

    def describe(self) -> str:
        chosen = f"the {self.k} most similar" if self.mode == "top_k" else f"those with cosine ≥ {self.similarity:g}"
        return f"each text of {self.left.sql()} keeps {chosen} texts of {self.right.sql()}"


def blocked_joins(statement: exp.Expression) -> list[tuple[exp.Expression, BlockedJoin]]:
    """Every AI filter call with a blocking option, and what it blocks; CompileError for a blocking option where
    it cannot apply (not in an ON clause, not two plain columns of two tables)."""
    found = []
    for node in list(statement.walk()):
        call = ai_call(node)
        if call is None or call.kind != "filter" or len(call.arguments) != 2:
            continue
        options = _options(call.arguments[1])
        if "blocking" not in options:
            continue
        found.append((node, _blocked(call, options)))
    return found


def without_blocking(statement: exp.Expression, pairs: PairsRelation, condition: exp.Expression) -> exp.Expression:
    """The statement reading the blocked pairs from relation `pairs`: the call replaced by `condition` (itself
    without the blocking options), the pairs joined between the two tables by equality with each document (one
    blocked join per statement)."""
    statement = statement.copy()
    located = blocked_joins(statement)
    if len(located) != 1:
        raise fail_at("a statement may block one AI join", statement)
    node, blocked = located[0]
    join = node.find_ancestor(exp.Join)
    select = node.find_ancestor(exp.Select)
    assert join is not None and select is not None
    node.replace(condition.copy())
    joined = _joined_alias(join, blocked)
    earlier, later = (blocked.left, blocked.right) if joined == _alias(blocked.right) else (blocked.right,
                                                                                                blocked.left)
    earlier_side, later_side = (LEFT, RIGHT) if earlier is blocked.left else (RIGHT, LEFT)
    pairs_join = exp.Join(this=pairs.table(), on=exp.EQ(this=pairs.column(earlier_side), expression=earlier.copy()))
    condition = exp.EQ(this=later.copy(), expression=pairs.column(later_side))
    join.set("on", exp.and_(condition, join.args["on"]))
    joins = select.args["joins"]
    joins.insert(joins.index(join), pairs_join)
    select.set("joins", joins)
    expand_star(select, pairs.alias)
    return statement


def unblocked(statement: exp.Expression) -> exp.Expression:
    """The statement as it would be without blocking: every pair asked (what the blocked join is measured against)."""
    statement = statement.copy()
    for node, blocked in blocked_joins(statement):
        node.replace(blocked.condition.copy())
    return statement


def anchored(condition: exp.Expression, alias: str) -> exp.Expression:
    """The call with `'anchor': alias` among its options (unless it names one): the blocked join then lays out each
    pair's prompt as the unblocked join does, so it asks the model exactly what the unblocked join would."""
    node = condition.copy()
    call = ai_call(node)
    assert call is not None
    if len(call.arguments) > 1 and "anchor" in _options(call.arguments[1]):
        return node
    entry = exp.PropertyEQ(this=exp.to_identifier("anchor"), expression=exp.Literal.string(alias))
    if len(call.arguments) > 1 and isinstance(call.arguments[1], exp.Struct):
        call.arguments[1].append("expressions", entry)
        return node
    inner = call.node.expression if isinstance(call.node, exp.Dot) else call.node
    inner.append("expressions", exp.Struct(expressions=[entry]))
    return node


def _joined_alias(join: exp.Join, blocked: BlockedJoin) -> str:
    """Which of the two tables the join clause holding the call brings in (the other came before it)."""
    alias = join.this.alias_or_name
    if alias not in (_alias(blocked.left), _alias(blocked.right)):
        raise fail_at(f"{blocked.call}: a blocked AI join's ON clause joins one of its two tables", join)
    return alias


def _alias(column: exp.Column) -> str:
    return column.table


def expand_star(select: exp.Select, hidden: str) -> None:
    """`SELECT *` reads every table of FROM: a relation of Quail's (`hidden`, the alias it is joined under) is not
    the user's, so each other table's columns instead."""
    if not any(isinstance(e, exp.Star) for e in select.expressions):
        return
    items = [item for alias, item in block_sources(select).items() if alias != hidden]
    stars = [exp.column(exp.Star(), table=item.alias_or_name) for item in items]
    expanded = [s for e in select.expressions for s in (stars if isinstance(e, exp.Star) else [e])]
    select.set("expressions", expanded)


def _options(node: exp.Expression) -> dict[str, exp.Expression]:
    if not isinstance(node, exp.Struct):
        return {}
    return {f[0].lower(): f[1] for entry in node.expressions if (f := struct_field(entry)) is not None}


def _blocked(call: AiCall, options: dict[str, exp.Expression]) -> BlockedJoin:
    node = call.node
    join = node.find_ancestor(exp.Join)
    if join is None:
        raise fail_at(f"{call.spelling}: blocking chooses the pairs of an AI join; write the call in the join's ON",
                      node)
    if join.args.get("side") or join.args.get("kind") not in (None, "", "INNER"):
        raise unsupported(f"blocking in a {join.args.get('side') or join.args.get('kind')} JOIN", join,
                          "blocking drops the pairs it does not keep, so it applies to an inner join")
    block = node.find_ancestor(exp.Select)
    if block is not None and any(isinstance(e, exp.Star) and any(e.args.get(k) for k in ("except_", "replace",
                                                                                        "rename"))
                                 for e in block.expressions):
        raise unsupported("SELECT * EXCLUDE / REPLACE beside a blocked AI join", block,
                          "name the columns you want")
    mode = options["blocking"]
    if not (isinstance(mode, exp.Literal) and mode.is_string and mode.this in MODES):
        raise unsupported(f"blocking {safe_sql(mode)}", mode, "write 'blocking': 'top_k' (with 'k') or "
                                                              "'threshold' (with 'similarity')")
    prompt = call.arguments[0]
    documents = list(prompt.expressions[1:]) if isinstance(prompt, exp.Anonymous) else []
    if len(documents) != 2 or not all(isinstance(d, exp.Column) and d.table for d in documents):
        raise unsupported(f"{call.spelling} blocking over {', '.join(safe_sql(d) for d in documents) or 'no column'}",
                          node, "a blocked AI join compares two qualified columns: PROMPT('…{0}…{1}…', a.x, b.y)")
    left, right = documents
    if left.table == right.table:
        raise fail_at(f"{call.spelling}: blocking compares two tables; both documents read {left.table}", node)
    top_k = str(mode.this) == "top_k"
    other = "similarity" if top_k else "k"
    if other in options:
        raise fail_at(f"blocking '{mode.this}' takes no '{other}'", options[other])
    k = _count(options.get("k"), top_k, mode)
    similarity = _similarity(options.get("similarity"), not top_k, mode)
    model = options.get(EMBEDDING_MODEL_OPTION)
    if model is not None and not (isinstance(model, exp.Literal) and model.is_string):
        raise unsupported(f"blocking model {safe_sql(model)}", model, "name the embedding model as a string")
    chosen: BlockingMode = "top_k" if str(mode.this) == "top_k" else "threshold"
    return BlockedJoin(safe_sql(node), _stripped(call), left, right, _table_of(left, node), _table_of(right, node),
                       _own_conditions(block, left.table), _own_conditions(block, right.table), chosen, k,
                       similarity, None if model is None else str(model.this))


def _own_conditions(block: exp.Select | None, alias: str) -> tuple[exp.Expression, ...]:
    """The top-level AND terms of the block's WHERE that read only `alias` (no AI call, no subquery)."""
    where = block.args.get("where") if block is not None else None
    if where is None:
        return ()
    return tuple(c.copy() for c in conjuncts(where.this) if not ai_calls(c) and c.find(exp.Select) is None
                 and {col.table for col in c.find_all(exp.Column)} == {alias})


def _stripped(call: AiCall) -> exp.Expression:
    """A copy of the call without the blocking options (and without its options object when nothing else is in it)."""
    node = call.node.copy()
    copied = ai_call(node)
    assert copied is not None
    options = copied.arguments[1]
    kept = [e for e in options.expressions if (f := struct_field(e)) is None or f[0].lower() not in OPTIONS]
    if kept:
        options.set("expressions", kept)
    else:
        options.pop()
    return node


def _count(node: exp.Expression | None, needed: bool, mode: exp.Expression) -> int | None:
    if node is None:
        if needed:
            raise fail_at("blocking 'top_k' needs 'k': how many partners each text keeps", mode)
        return None
    value = number(node)
    if value is None or value != int(value) or not 1 <= value <= MAX_K:
        raise fail_at(f"k must be a whole number from 1 to {MAX_K}, got {safe_sql(node)}", node)
    return int(value)


def _similarity(node: exp.Expression | None, needed: bool, mode: exp.Expression) -> float | None:
    if node is None:
        if needed:
            raise fail_at("blocking 'threshold' needs 'similarity': the cosine a pair must reach", mode)
        return None
    value = number(node)
    if value is None or not -1 <= value <= 1:
        raise fail_at(f"similarity must be a cosine from -1 to 1, got {safe_sql(node)}", node)
    return value


def _table_of(column: exp.Column, node: exp.Expression) -> exp.Expression:
    """The registered table the column's qualifier names in the call's block (a CTE or a subquery is refused: the
    texts to embed are read from the table itself)."""
    block = node.find_ancestor(exp.Select)
    assert block is not None
    ctes = {cte.alias.lower() for cte in block.root().find_all(exp.CTE)}
    for alias, item in block_sources(block).items():
        if alias == column.table:
            if not isinstance(item, exp.Table) or item.name.lower() in ctes:
                raise unsupported(f"blocking over {safe_sql(item)}", item, "a blocked AI join reads two registered "
                                  "tables; join a CTE or subquery around it instead")
            return item
    raise fail_at(f"{column.sql()} names no table of its block", column)
