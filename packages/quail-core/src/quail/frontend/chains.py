"""Two AI predicates over the same two tables in one query block: the first judged alone, its TRUE pairs the
candidates of the rest.

`JOIN c ON AI_FILTER(PROMPT('… {0} … {1}', a.x, c.y)) AND AI_FILTER(PROMPT('… {0} … {1}', a.z, c.y))` asks two
questions of every pair. An AI join takes one AI predicate, so the block runs in two steps. First, the pairs: a
query of its own joins the two tables on the first predicate alone, under every condition of the block that reads
only those two tables (their own filters, AI ones included, and conditions between them), and keeps the distinct
tuples of the predicate's documents it holds for. Then the block as written, the first predicate replaced by an
equality join with those tuples (a relation registered for the run): the planner asks the remaining predicate only
of the pairs that passed the first, exactly as it asks a blocked join its kept pairs (`frontend.blocking`). A
predicate's answer depends only on its documents, so a pair passes the equality exactly when the first predicate
holds for it: the rows are those of the block as written, and the first predicate is asked each pair once.
Only inner joins (and WHERE) chain: in a LEFT JOIN's ON a pair failing either predicate still keeps its left row.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from quail.frontend.blocking import expand_star
from quail.frontend.lookups import PAIR_KEY, block_sources, cte_clause, inner_conditions, pairs_query
from quail.frontend.syntax import AiCall, ai_call, ai_calls, safe_sql


@dataclass(frozen=True)
class PairChain:
    """A block's first AI predicate over two tables that another predicate of the block also reads."""

    block: exp.Select
    first: AiCall
    aliases: tuple[str, str]
    """The two tables, in the order the block joins them."""
    documents: tuple[exp.Column, ...]

    def describe(self) -> str:
        return (f"two AI predicates over {self.aliases[0]} and {self.aliases[1]}: {safe_sql(self.first.node)} is asked "
                "first, over every pair the block's conditions on those two tables keep; the other is asked only "
                "of the pairs it holds for")


def pair_chain(statement: exp.Expression) -> PairChain | None:
    """The first block of `statement` (outermost first) holding two AI predicates over the same two tables in the
    top-level AND of its WHERE and inner joins' ON clauses, with the first of them; None when there is none."""
    for block in statement.find_all(exp.Select):
        by_tables: dict[frozenset[str], list[AiCall]] = {}
        for condition in inner_conditions(block):
            call = ai_call(condition)
            aliases = _aliases(condition)
            if call is not None and call.kind == "filter" and len(aliases) == 2:
                by_tables.setdefault(frozenset(aliases), []).append(call)
        for calls in by_tables.values():
            chain = _chain(block, calls[0]) if len(calls) > 1 else None
            if chain is not None:
                return chain
    return None


def first_stage(chain: PairChain, statement: exp.Expression) -> exp.Select:
    """SELECT DISTINCT <the first predicate's documents> AS k0, … FROM <the two tables> WHERE <the first predicate>
    AND <the block's other conditions on those two tables alone, but its other AI predicates over both>."""
    sources = block_sources(chain.block)
    earlier, later = chain.aliases
    kept = [c for c in inner_conditions(chain.block) if c is not chain.first.node and _aliases(c) <= {earlier, later}
            and c.find(exp.Select) is None and not _reads_both_by_ai(c)]
    select = pairs_query(sources[earlier], sources[later], _keys(chain), [chain.first.node, *kept])
    return cte_clause(select, statement)


def rest_stage(chain: PairChain, statement: exp.Expression, relation: str) -> exp.Expression:
    """`statement` with the first predicate replaced by equalities with the pairs relation `relation`, joined right
    after the earlier of the two tables (the tree is copied)."""
    statement = statement.copy()
    located = pair_chain(statement)
    assert located is not None and located.first.node == chain.first.node
    block, earlier = located.block, located.aliases[0]
    keys = _keys(located)
    for node in (located.first.node, *(condition for condition, _ in _implied(located))):
        _drop(node)
    suffix = relation.rsplit("_", 1)[-1]
    alias = f"quail_pairs_{suffix}"
    columns = [f"quail_{PAIR_KEY}{i}_{suffix}" for i in range(len(keys))]
    inner = exp.select(*[exp.alias_(exp.column(f"{PAIR_KEY}{i}"), name) for i, name in enumerate(columns)])
    table = exp.Subquery(this=inner.from_(exp.to_table(relation)), alias=exp.TableAlias(this=exp.to_identifier(alias)))
    equal = [exp.EQ(this=exp.column(name, table=alias), expression=key.copy())
             for name, key in zip(columns, keys, strict=True)]
    on_earlier = [e for e, k in zip(equal, keys, strict=True) if k.table == earlier]
    on_later = [e for e, k in zip(equal, keys, strict=True) if k.table != earlier]
    joins = list(block.args.get("joins") or [])
    place = next(i for i, join in enumerate(joins) if join.this.alias_or_name == located.aliases[1])
    later = joins[place]
    joins.insert(place, exp.Join(this=table, on=exp.and_(*on_earlier)))
    block.set("joins", joins)
    on = later.args.get("on")
    if on is not None:
        later.set("on", exp.and_(*on_later, *([] if isinstance(on, exp.Boolean) and on.this else [on])))
    else:
        where = block.args.get("where")
        block.set("where", exp.Where(this=exp.and_(*on_later, *([where.this] if where is not None else []))))
    expand_star(block, alias)
    return statement


def _implied(chain: PairChain) -> list[tuple[exp.Expression, list[exp.Column]]]:
    """The block's AI filters over one of the two tables alone (top-level AND terms, prompts over plain columns): the
    first step applies them, so a row whose pair of documents is among its tuples has passed them — the second step
    needs not ask them again."""
    found = []
    for condition in inner_conditions(chain.block):
        call = ai_call(condition)
        if call is None or call.kind != "filter" or condition is chain.first.node:
            continue
        prompt = call.arguments[0] if call.arguments else None
        documents = prompt.expressions[1:] if isinstance(prompt, exp.Anonymous) else []
        columns = [d for d in documents if isinstance(d, exp.Column) and d.table]
        if len(_aliases(condition)) == 1 and _aliases(condition) <= set(chain.aliases) and documents and \
                len(columns) == len(documents):
            found.append((condition, columns))
    return found


def _keys(chain: PairChain) -> list[exp.Column]:
    """The pairs relation's columns: the first predicate's documents, then the columns the implied filters read."""
    keys: dict[str, exp.Column] = {}
    read = [*chain.documents, *(column for _, columns in _implied(chain) for column in columns)]
    for column in read:
        keys.setdefault(column.sql(), column)
    return list(keys.values())


def _chain(block: exp.Select, call: AiCall) -> PairChain | None:
    """The chain whose first predicate is `call`, when its documents are columns of two tables of the block."""
    order = list(block_sources(block))
    aliases = _aliases(call.node)
    prompt = call.arguments[0] if call.arguments else None
    documents = tuple(prompt.expressions[1:]) if isinstance(prompt, exp.Anonymous) else ()
    if not aliases <= set(order) or not all(isinstance(d, exp.Column) and d.table for d in documents):
        return None
    earlier, later = sorted(aliases, key=order.index)
    return PairChain(block, call, (earlier, later), tuple(d for d in documents if isinstance(d, exp.Column)))


def _aliases(node: exp.Expression) -> set[str]:
    return {column.table for column in node.find_all(exp.Column) if column.table}


def _reads_both_by_ai(condition: exp.Expression) -> bool:
    return any(len(_aliases(call.node)) > 1 for call in ai_calls(condition))


def _drop(node: exp.Expression) -> None:
    """Remove one AND term from its condition (TRUE when it was the whole of it)."""
    parent = node.parent
    while isinstance(parent, exp.Paren):
        node, parent = parent, parent.parent
    if isinstance(parent, exp.And):
        other = parent.expression if parent.this is node else parent.this
        parent.replace(other)
    else:
        node.replace(exp.true())
