"""The general rule: an AI call that reads one table is a column of that table's rows.

The planner of filters and joins reads one query block (`sql.py`); a statement it cannot plan whole — AI
calls in several blocks (`UNION`, a CTE over an AI CTE, `IN (SELECT ... AI ...)`), correlated subqueries
over their own table, `RIGHT` / `FULL` / `LEFT` joins with AI conditions, AI calls over expressions — is
answered by this rule instead. Each AI call whose arguments read one table (and whose table holds no AI
call itself) becomes a *lookup*: an AI query over the distinct values of its arguments, planned by the
ordinary planner, after the conditions of its own block that can be pushed below it; the user's statement
then runs on DuckDB unchanged except that the call reads its answer from the lookup. Calls over tables
that are themselves AI results wait for those (`stage`), so any nesting resolves in rounds.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from sqlglot import exp

from quail.errors import CompileError
from quail.frontend.calls import call_value, duckdb_type, output_type, value_type
from quail.frontend.models import block_models, model_option
from quail.frontend.syntax import OUTPUT_TYPES, AiCall, AiKind, ai_call, ai_calls, conjuncts, fail_at, safe_sql

LOOKUP_ALIAS = "d"
"""The alias of the distinct inputs inside a lookup's AI query."""
VALUE = "v"


class Describer(Protocol):
    """What the rule asks of the session's DuckDB: the columns a relation has (registered tables included)."""

    def describe(self, sql: str) -> pa.Schema: ...

    def schema_of(self, table: str) -> pa.Schema | None: ...


@dataclass(frozen=True)
class Lookup:
    """One AI call answered over the distinct values of its arguments."""

    name: str
    """The relation its answers are registered under while the statement runs."""
    kind: AiKind
    value: pa.DataType
    """The type of `v`: what the call reads as in the statement (`calls.value_type`)."""
    inner: exp.Select
    """The AI query over the distinct inputs (columns doc0, doc1, ... and `v`), for the ordinary planner."""
    inputs: int
    call: str
    """The call as the user wrote it, for explain()."""
    table: str
    """What it reads: `alias (table)`, for explain()."""
    pushed: tuple[str, ...]
    """Conditions of its block evaluated below it (the model sees only rows that pass them)."""

    @property
    def columns(self) -> tuple[str, ...]:
        return (*(f"doc{i}" for i in range(self.inputs)), VALUE)


@dataclass(frozen=True)
class Block:
    """A CTE's or derived table's query block whose AI calls join tables: planned whole by the one-block planner,
    its rows then read as a table."""

    name: str
    inner: exp.Select
    """The block (with the CTEs it reads), for the ordinary planner."""
    text: str
    stand_in: str
    """The block with each AI call a typed NULL: DuckDB describes its columns without any model work."""
    pairs: bool = False
    """An AI call over two tables asked of the pairs of their rows (`_pair_lookup`): its rows, the pairs of
    documents it holds for."""


@dataclass(frozen=True)
class Stage:
    """The lookups and blocks of one round, and the statement with their calls and blocks replaced."""

    lookups: tuple[Lookup | Block, ...]
    statement: exp.Expression


class _TwoTables(Exception):
    """An AI call that reads two (or more) tables: not a lookup of one; its block may be planned whole, or the call
    asked of the pairs of its two tables (`_pair_lookup`)."""

    def __init__(self, sources: Sequence[_Source]) -> None:
        super().__init__()
        self.sources = tuple(sources)


def has_ai_calls(node: exp.Expression) -> bool:
    return any(ai_call(item) is not None for item in node.walk())


def next_stage(statement: exp.Expression, relations: Describer, prefix: str, counter: itertools.count) -> Stage:
    """The AI calls answerable now (their table holds no AI call), each made a lookup named `{prefix}{n}`."""
    statement = statement.copy()
    sample = statement.find(exp.TableSample)
    if sample is not None:  # a lookup and the statement reading it would each draw other rows
        raise fail_at("TABLESAMPLE beside AI calls: each reading of the table draws other rows; sample into a file "
                      "first and register that", sample)
    ctes = _ctes(statement)
    lookups: list[Lookup | Block] = []
    replacements: list[tuple[exp.Expression, exp.Expression]] = []
    located = _located(statement, ctes, relations)
    blocks, paired = _joining_blocks(located)
    for call, two in paired:
        pairs = _pair_lookup(call, two, ctes, f"{prefix}{next(counter)}")
        if pairs is not None:
            lookups.append(pairs)
            replacements.append((call.node, _pair_reading(pairs.name, _documents(call))))
    for block in blocks:
        if any(_holds_ai(node, ctes) for node in block_sources(block).values()):
            continue  # it reads AI results: a later round
        name = f"{prefix}{next(counter)}"
        lookups.append(_planned_block(block, ctes, name))
        replacements.append((block, exp.select("*").from_(exp.to_table(name))))
    for call, source in located:
        if any(block in _ancestors(call.node) for block in blocks) or isinstance(source, _TwoTables):
            continue
        lookup = _lookup(call, source, ctes, relations, f"{prefix}{next(counter)}")
        if lookup is None:
            continue
        same = next((o for o in lookups if isinstance(o, Lookup) and o.value == lookup.value
                     and o.inner.sql() == lookup.inner.sql()), None)
        if same is None:  # the same call over the same rows twice (AI_EMBED(x) beside AI_SIMILARITY(x, …)): once
            lookups.append(lookup)
        replacements.append((call.node, _value(call, _reading(same or lookup, _keys(call)))))
    for node, replacement in replacements:
        node.replace(replacement)
    return Stage(tuple(lookups), statement)


def shared_rows(lookups: Sequence[Lookup | Block]) -> list[tuple[Lookup | Block, ...]]:
    """The round's lookups in groups asked as one query: calls over the same distinct rows of the same table (the same
    documents, conditions and model) share their documents' tokens and KV there, as the calls of one block do. An
    embedding lookup and a planned block stand alone."""
    groups: dict[str, list[Lookup | Block]] = {}
    for index, lookup in enumerate(lookups):
        key = _rows_key(lookup) if isinstance(lookup, Lookup) and lookup.kind != "embed" else f"\x00{index}"
        groups.setdefault(key, []).append(lookup)
    return [tuple(group) for group in groups.values()]


def shared_inner(group: Sequence[Lookup]) -> exp.Select:
    """One AI query answering every lookup of `group` (`shared_rows`): the distinct rows once, the i-th call as
    column `v{i}`."""
    inner = group[0].inner.copy()
    values = [exp.alias_(_value_of(lookup).copy(), f"{VALUE}{i}") for i, lookup in enumerate(group)]
    inner.set("expressions", [*inner.expressions[:-1], *values])
    return inner


def _rows_key(lookup: Lookup) -> str:
    """What a lookup's query reads and with which model: its inner query without the call."""
    rows = lookup.inner.copy()
    rows.set("expressions", rows.expressions[:-1])
    call = ai_call(_value_of(lookup))
    return f"{rows.sql()}\x00{model_option(call) if call is not None else None}"


def _value_of(lookup: Lookup) -> exp.Expression:
    value = lookup.inner.expressions[-1]
    return value.this if isinstance(value, exp.Alias) else value


def _ancestors(node: exp.Expression) -> list[exp.Expression]:
    found, current = [], node.parent
    while current is not None:
        found.append(current)
        current = current.parent
    return found


def _located(statement: exp.Expression, ctes: Mapping[str, exp.CTE], relations: Describer
             ) -> list[tuple[AiCall, _Source | _TwoTables | None]]:
    """Every AI call with the one table it reads (None: constants), or `_TwoTables` where it reads two."""
    located: list[tuple[AiCall, _Source | _TwoTables | None]] = []
    for call in ai_calls(statement):
        try:
            located.append((call, _sources(call, ctes, relations)))
        except _TwoTables as two:
            located.append((call, two))
    return located


def _joining_blocks(located: Sequence[tuple[AiCall, _Source | _TwoTables | None]]
                    ) -> tuple[list[exp.Select], list[tuple[AiCall, _TwoTables]]]:
    """The CTE bodies, derived tables and set-operation branches whose AI calls over two tables are all AI joins
    (top-level AND terms of WHERE or of an inner or LEFT join's ON): each planned whole. Every other call over two
    tables — in OR, NOT, CASE or SELECT, in a RIGHT or FULL join's ON, in a correlated subquery, in a block that is
    not a query of its own, in a block whose calls name different models — is asked of the pairs of its two tables
    instead (`_pair_lookup`)."""
    two_table = [(call, source) for call, source in located if isinstance(source, _TwoTables)]
    by_block: dict[int, tuple[exp.Select | None, list[tuple[AiCall, _TwoTables]]]] = {}
    for call, source in two_table:
        block = call.node.find_ancestor(exp.Select)
        by_block.setdefault(id(block), (block, []))[1].append((call, source))
    blocks: list[exp.Select] = []
    paired: list[tuple[AiCall, _TwoTables]] = []
    for block, calls in by_block.values():
        if block is not None and _standalone(block) and len(block_models(block)) == 1 and \
                all(_joins_on(call, block, two) for call, two in calls):
            blocks.append(block)
        else:
            paired.extend(calls)
    kept = [b for b in blocks if not any(o is not b and o in _ancestors(b) for o in blocks)]
    return kept, paired


def _joins_on(call: AiCall, block: exp.Select, two: _TwoTables) -> bool:
    """Whether the call is an AI join the planner of one block plans: both its tables in this block, the call a
    top-level AND term of its WHERE or of an inner or LEFT join's ON."""
    if any(source.block is not block for source in two.sources):
        return False
    node = call.node
    while isinstance(node.parent, exp.And | exp.Paren):
        node = node.parent
    holder = node.parent
    if isinstance(holder, exp.Where):
        return holder.parent is block
    return isinstance(holder, exp.Join) and holder.parent is block and holder.args.get("on") is node and \
        (holder.args.get("side") or "").upper() in ("", "LEFT") and \
        (holder.args.get("kind") or "").upper() in ("", "INNER", "OUTER", "CROSS")


def _pair_lookup(call: AiCall, two: _TwoTables, ctes: Mapping[str, exp.CTE], name: str) -> Block | None:
    """A TRUE/FALSE question over two tables asked of the pairs of their rows, as an AI join of the two (`SELECT
    DISTINCT <documents> FROM a CROSS JOIN b WHERE <the call> [AND what is sound to apply below it]`, planned whole);
    the statement then reads, per pair of documents, whether it is among the pairs that join
    (`_pair_reading`). None while a table holds AI calls (a later round); refused where it cannot apply (a score or
    label over two tables, a prompt over three tables or over expressions)."""
    documents = _documents(call)
    if call.kind != "filter" or len(two.sources) != 2 or not all(isinstance(d, exp.Column) for d in documents):
        raise fail_at(f"{call.spelling} over {len(two.sources)} tables outside the top-level AND of WHERE and ON: "
                      "only a TRUE/FALSE question over two tables' columns is asked of their pairs there", call.node)
    if any(_holds_ai(source.node, ctes) for source in two.sources):
        return None
    first, second = two.sources
    inner = pairs_query(first.node, second.node, documents, [call.node, *_pair_pushed(call, two)])
    inner = _with_ctes(inner, inner, ctes)
    return Block(name, inner, safe_sql(call.node), stand_in(inner), pairs=True)


PAIR_KEY = "k"
"""A pairs query's columns: k0, k1, … — the documents (and columns) its keys name, in order."""


def pairs_query(first: exp.Expression, second: exp.Expression, keys: Sequence[exp.Expression],
                conditions: Sequence[exp.Expression]) -> exp.Select:
    """`SELECT DISTINCT <keys> AS k0, … FROM <first> CROSS JOIN <second> WHERE <conditions>`: the tuples of
    documents of the pairs of two tables' rows the conditions (a question over both among them) hold for — an AI
    join the planner of one block plans. The pair lookups and the first step of a chain (`frontend.chains`) ask it."""
    columns = [exp.alias_(key.copy(), f"{PAIR_KEY}{i}") for i, key in enumerate(keys)]
    return (exp.select(*columns).distinct().from_(first.copy()).join(second.copy(), join_type="cross")
            .where(exp.and_(*(c.copy() for c in conditions))))


def inner_conditions(block: exp.Select) -> list[exp.Expression]:
    """The top-level AND terms of the block's inner joins' ON clauses, then of its WHERE: what holds of every row
    the block reads."""
    found = []
    for join in block.args.get("joins") or []:
        inner = not join.args.get("side") and (join.args.get("kind") or "").upper() in ("", "INNER", "CROSS")
        if inner and join.args.get("on") is not None:
            found.extend(conjuncts(join.args["on"]))
    where = block.args.get("where")
    return found + (conjuncts(where.this) if where is not None else [])


def _pair_pushed(call: AiCall, two: _TwoTables) -> list[exp.Expression]:
    """What may narrow the pairs asked: when both tables are the call's own block's and the block evaluates the call
    after its joins and WHERE (not in an ON clause), the top-level conditions of its WHERE and of its inner joins' ON
    clauses on either table alone or on the two (no AI call, no subquery)."""
    block = call.node.find_ancestor(exp.Select)
    if block is None or any(s.block is not block for s in two.sources) or call.node.find_ancestor(exp.Join):
        return []
    aliases = {s.alias.lower() for s in two.sources}
    return [c for c in inner_conditions(block)
            if not has_ai_calls(c) and c.find(exp.Select) is None
            and {col.table.lower() for col in c.find_all(exp.Column)} <= aliases
            and all(col.table for col in c.find_all(exp.Column))]


def _pair_reading(name: str, documents: Sequence[exp.Expression]) -> exp.Expression:
    """Whether this row's pair of documents is among those the question holds for: NULL where a document is NULL
    (an AI value of NULL text is NULL), else whether the pair lookup `name` holds it."""
    null = exp.or_(*(exp.Is(this=d.copy(), expression=exp.Null()) for d in documents))
    found = exp.select("1").from_(exp.to_table(name, alias="p")).where(exp.and_(
        *(exp.EQ(this=exp.column(f"{PAIR_KEY}{i}", table="p"), expression=d.copy()) for i, d in enumerate(documents))))
    return exp.Case(ifs=[exp.If(this=null, true=exp.Null())], default=exp.Exists(this=found))


def _standalone(block: exp.Select) -> bool:
    """A CTE's body, a derived table in FROM / JOIN or a branch of a set operation: a query of its own."""
    parent = block.parent
    return isinstance(parent, exp.CTE | exp.SetOperation) or (
        isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.From | exp.Join))


def _planned_block(block: exp.Select, ctes: Mapping[str, exp.CTE], name: str) -> Block:
    inner = _with_ctes(block.copy(), block, ctes)
    return Block(name, inner, safe_sql(block), stand_in(inner))


def stand_in(query: exp.Expression) -> str:
    """`query` with each AI call a typed NULL, in DuckDB's SQL: DuckDB describes its columns without model work."""
    copied = query.copy()
    for call in ai_calls(copied):
        call.node.replace(call_value(call, exp.cast(exp.null(), duckdb_type(output_type(call)))))
    return copied.sql("duckdb")


# -- one call ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    alias: str
    node: exp.Expression
    """The table or subquery in its block's FROM / JOIN."""
    block: exp.Select


def _lookup(call: AiCall, source: _Source | None, ctes: Mapping[str, exp.CTE], relations: Describer,
            name: str) -> Lookup | None:
    """The call as a lookup over `source`, or None while that table holds AI calls (a later round)."""
    if source is not None and _holds_ai(source.node, ctes):
        return None
    pushed = _pushed(call, source, ctes, relations) if source is not None else []
    keys = _keys(call)
    inner = _inner_query(call, keys, source, pushed, ctes)
    table = "constants" if source is None else f"{source.alias} ({safe_sql(source.node)})"
    value = OUTPUT_TYPES["embed"] if call.kind == "embed" else value_type(call)
    return Lookup(name, call.kind, value, inner, len(keys), safe_sql(call.node), table,
                  tuple(safe_sql(p) for p in pushed))


def _sources(call: AiCall, ctes: Mapping[str, exp.CTE], relations: Describer) -> _Source | None:
    """The one table the call's documents read (None for constants); `_TwoTables` when they read two."""
    documents = _documents(call)
    columns = [c for d in documents for c in d.find_all(exp.Column)]
    if any(d.find(exp.Select) is not None or has_ai_calls(d) for d in documents):
        raise fail_at(f"a subquery or an AI call inside the arguments of {call.spelling}", call.node)
    found: dict[tuple[str, int], _Source] = {}
    for column in columns:
        source = _source_of(column, ctes, relations)
        if source is not None:
            found[(source.alias, id(source.block))] = source
    if len(found) > 1:
        raise _TwoTables(list(found.values()))
    return next(iter(found.values()), None)


def _documents(call: AiCall) -> list[exp.Expression]:
    """The expressions the call reads as documents: PROMPT's arguments after the template, or a plain input."""
    if not call.arguments:
        raise fail_at(f"{call.spelling}() without arguments", call.node)
    first = call.arguments[0]
    if isinstance(first, exp.Anonymous) and str(first.name).upper() == "PROMPT":
        return list(first.expressions[1:])
    if call.kind in ("classify", "embed"):
        return [first]
    raise fail_at(f"{call.spelling} over {safe_sql(first)}: write {call.spelling}(PROMPT('…{{0}}…', column))",
                  call.node)


def _keys(call: AiCall) -> list[exp.Expression]:
    """What the lookup is keyed by: the call's documents, or — when its prompt reads several columns of its one
    table — one document of named fields (`title: …` on a line each; NULL when any is NULL), which the lookup's
    AI query reads under the template with each placeholder naming its field."""
    documents = _documents(call)
    if len(documents) < 2:
        return documents
    fields: exp.Expression | None = None
    for index, document in enumerate(documents):
        line = exp.DPipe(this=exp.Literal.string(f"{_label(document, index)}: "),
                         expression=exp.cast(document.copy(), "VARCHAR"))
        fields = line if fields is None else exp.DPipe(
            this=exp.DPipe(this=fields, expression=exp.Literal.string("\n")), expression=line)
    assert fields is not None
    return [fields]


def _label(document: exp.Expression, index: int) -> str:
    return document.name if isinstance(document, exp.Column) else f"field {index}"


def _fields_template(call: AiCall) -> str:
    """The template over one document of fields: `{0}`, then the user's text with each placeholder naming its field
    (`Given the title [title] and the review [body], ...`)."""
    documents = _documents(call)
    named = PLACEHOLDER_SPLIT.sub(lambda m: f"[{_label(documents[int(m.group(1))], int(m.group(1)))}]",
                                  _template(call))
    return "{0}\n" + named


PLACEHOLDER_SPLIT = re.compile(r"\{(\d+)\}")


def _template(call: AiCall) -> str:
    prompt = call.arguments[0]
    assert isinstance(prompt, exp.Anonymous) and prompt.expressions
    return str(prompt.expressions[0].this)


def _source_of(column: exp.Column, ctes: Mapping[str, exp.CTE], relations: Describer) -> _Source | None:
    """The FROM / JOIN item of the nearest block (this one, then the ones around it) that has this column."""
    qualifier = column.table.lower()
    block = column.find_ancestor(exp.Select)
    while block is not None:
        for alias, node in block_sources(block).items():
            if qualifier and alias.lower() == qualifier:
                return _Source(alias, node, block)
            if not qualifier and column.name.lower() in _column_names(node, ctes, relations):
                return _Source(alias, node, block)
        block = block.parent.find_ancestor(exp.Select) if block.parent is not None else None
    return None


def block_sources(block: exp.Select) -> dict[str, exp.Expression]:
    """The tables and subqueries of a block's FROM and JOIN items, by alias, in order."""
    sources: dict[str, exp.Expression] = {}
    source = block.args.get("from_") or block.args.get("from")
    items = [source.this] if source is not None else []
    items += [join.this for join in block.args.get("joins") or []]
    for item in items:
        if isinstance(item, exp.Table | exp.Subquery):
            sources[item.alias_or_name] = item
    return sources


def _column_names(node: exp.Expression, ctes: Mapping[str, exp.CTE], relations: Describer) -> set[str]:
    if isinstance(node, exp.Table) and node.name.lower() not in ctes:
        schema = relations.schema_of(node.name)
        if schema is not None:
            return {n.lower() for n in schema.names}
    if _holds_ai(node, ctes):
        return set()
    try:
        return {n.lower() for n in relations.describe(_select_all(node, ctes)).names}
    except CompileError:
        return set()


def _select_all(node: exp.Expression, ctes: Mapping[str, exp.CTE]) -> str:
    source = node.copy()
    source.set("alias", None)
    return _with_ctes(exp.select("*").from_(source), source, ctes).sql("duckdb")


def _pushed(call: AiCall, source: _Source, ctes: Mapping[str, exp.CTE], relations: Describer) -> list[exp.Expression]:
    """Conditions of the call's block that read only its table: sound to apply below the call wherever the
    block evaluates it after WHERE (SELECT, WHERE, GROUP BY, HAVING, ORDER BY, windows) — not in an ON clause,
    where a row the condition removes could still pick the other side of an outer join. A correlated equality
    with a table of a block around (`c.film_id = f.id`) narrows the table to the values that table has
    (`c.film_id IN (SELECT f.id FROM films f)`)."""
    if call.node.find_ancestor(exp.Select) is not source.block or call.node.find_ancestor(exp.Join) is not None:
        return []
    where = source.block.args.get("where")
    if where is None:
        return []
    kept = _own_conditions(source)
    for condition in conjuncts(where.this):
        narrowing = _correlated(condition, source, ctes, relations)
        if narrowing is not None:
            kept.append(narrowing)
    return kept


def _correlated(condition: exp.Expression, source: _Source, ctes: Mapping[str, exp.CTE],
                relations: Describer) -> exp.Expression | None:
    """`mine.x IN (SELECT theirs.y FROM <their table>)` for `mine.x = theirs.y` with `theirs` a table of a block
    around the call's (a correlated subquery), when that table holds no AI call."""
    if not isinstance(condition, exp.EQ):
        return None
    sides = (condition.this, condition.expression)
    for mine, theirs in (sides, sides[::-1]):
        if not (isinstance(mine, exp.Column) and isinstance(theirs, exp.Column)):
            continue
        if mine.table.lower() != source.alias.lower():
            continue
        outer = _source_of(theirs, ctes, relations)
        if outer is None or outer.block is source.block or _holds_ai(outer.node, ctes):
            continue
        values = exp.select(theirs.copy()).from_(outer.node.copy())
        if not _within_a_join(source.block, outer.block):
            own = _own_conditions(outer)
            if own:
                values = values.where(exp.and_(*own))
        return exp.In(this=mine.copy(), query=exp.Subquery(this=values))
    return None


def _own_conditions(source: _Source) -> list[exp.Expression]:
    """The top-level conditions of a block's WHERE that read only this table (and no AI, no subquery)."""
    where = source.block.args.get("where")
    if where is None:
        return []
    return [c.copy() for c in conjuncts(where.this) if not has_ai_calls(c) and c.find(exp.Select) is None
            and {col.table.lower() for col in c.find_all(exp.Column)} == {source.alias.lower()}]


def _within_a_join(node: exp.Expression, block: exp.Select) -> bool:
    """Whether `node` sits in an ON clause of `block` (where the block's WHERE does not decide its rows)."""
    current = node.parent
    while current is not None and current is not block:
        if isinstance(current, exp.Join):
            return True
        current = current.parent
    return False


# -- the lookup's AI query and the statement's reading of it -------------------------------------------------


def _inner_query(call: AiCall, documents: Sequence[exp.Expression], source: _Source | None,
                 pushed: Sequence[exp.Expression], ctes: Mapping[str, exp.CTE]) -> exp.Select:
    """SELECT d.doc0, ..., <call over d.doc_i> AS v FROM (SELECT DISTINCT <documents> FROM <table> WHERE ...) d"""
    inputs = [exp.alias_(exp.cast(d.copy(), "VARCHAR"), f"doc{i}") for i, d in enumerate(documents)]
    distinct = exp.select(*inputs).distinct()
    if source is not None:
        distinct = distinct.from_(source.node.copy())
        if pushed:
            distinct = distinct.where(exp.and_(*pushed))
    derived = exp.Subquery(this=distinct, alias=exp.TableAlias(this=exp.to_identifier(LOOKUP_ALIAS)))
    rewritten = _one_spelling(call.node.copy()) if call.kind == "embed" else call.node.copy()
    copied = ai_call(rewritten)
    assert copied is not None
    if len(_documents(copied)) > len(documents):  # the prompt rendered whole is the one document
        copied.arguments[0].replace(exp.Anonymous(this="PROMPT", expressions=[
            exp.Literal.string(_fields_template(call)), exp.column("doc0", table=LOOKUP_ALIAS)]))
    else:
        for index, document in enumerate(_documents(copied)):
            document.replace(exp.column(f"doc{index}", table=LOOKUP_ALIAS))
    items = [exp.column(f"doc{i}", table=LOOKUP_ALIAS) for i in range(len(documents))]
    return _with_ctes(exp.select(*items, exp.alias_(rewritten, VALUE)).from_(derived), distinct, ctes)


def _one_spelling(node: exp.Expression) -> exp.Expression:
    """An embedding call as Snowflake spells it (its value is the vector): BigQuery's `AI.EMBED(x)` and Snowflake's
    `AI_EMBED(x)` over the same rows are then one lookup, each text embedded once."""
    call = ai_call(node)
    assert call is not None
    return exp.Anonymous(this="AI_EMBED", expressions=[a.copy() for a in call.arguments])


def _value(call: AiCall, reading: exp.Expression) -> exp.Expression:
    """What the call reads as, from its lookup's answer: the answer itself (a lookup's `v` is the call's value), except
    an embedding's, which every spelling shares as the vector — BigQuery's STRUCT is made here, NULL for a NULL text."""
    if call.kind != "embed" or not call.spelling.startswith("AI."):
        return reading
    present = exp.Not(this=exp.Is(this=reading.copy(), expression=exp.Null()))
    return exp.Case(ifs=[exp.If(this=present, true=call_value(call, reading))])


def _reading(lookup: Lookup, documents: Sequence[exp.Expression]) -> exp.Expression:
    """(SELECT v FROM lookup WHERE doc0 IS NOT DISTINCT FROM <argument 0> AND ...): the call's answer for
    this row, NULL for a NULL input (the lookup answers NULL for it, as the call would)."""
    relation = exp.alias_(exp.to_table(lookup.name), "l", table=True)
    matches = [exp.NullSafeEQ(this=exp.column(f"doc{i}", table="l"), expression=exp.cast(d.copy(), "VARCHAR"))
               for i, d in enumerate(documents)]
    select = exp.select(exp.column(VALUE, table="l")).from_(relation)
    if matches:
        select = select.where(exp.and_(*matches))
    return exp.Subquery(this=select)


# -- CTEs ------------------------------------------------------------------------------------------------------


def _ctes(statement: exp.Expression) -> dict[str, exp.CTE]:
    return {cte.alias.lower(): cte for cte in statement.find_all(exp.CTE)}


def _needed_ctes(node: exp.Expression, ctes: Mapping[str, exp.CTE]) -> list[exp.CTE]:
    """The CTEs `node` reads, directly or through each other, in the order the statement defines them."""
    wanted: set[str] = set()
    pending = [node]
    while pending:
        for table in pending.pop().find_all(exp.Table):
            name = table.name.lower()
            if name in ctes and name not in wanted:
                wanted.add(name)
                pending.append(ctes[name].this)
    return [cte for name, cte in ctes.items() if name in wanted]


def _with_ctes(select: exp.Select, reader: exp.Expression, ctes: Mapping[str, exp.CTE]) -> exp.Select:
    """`select` with a WITH of the statement's CTEs that `reader` reads (none: unchanged)."""
    needed = _needed_ctes(reader, ctes)
    if needed:
        select.set("with_", exp.With(expressions=[c.copy() for c in needed], recursive=_recursive(needed)))
    return select


def cte_clause(select: exp.Select, statement: exp.Expression) -> exp.Select:
    """`select` (a query Quail writes from parts of `statement`) with a WITH of the statement's CTEs it reads."""
    return _with_ctes(select, select, _ctes(statement))


def _recursive(ctes: Sequence[exp.CTE]) -> bool:
    return any(bool(c.parent is not None and c.parent.args.get("recursive")) for c in ctes)


def _holds_ai(node: exp.Expression, ctes: Mapping[str, exp.CTE]) -> bool:
    return has_ai_calls(node) or any(has_ai_calls(c.this) for c in _needed_ctes(node, ctes))

