"""The SQL front end: sqlglot parses, this module reads the tree into a QuerySpec.

One reader for both dialects (`syntax.py` normalises the spellings). It finds the query block that
holds the AI calls (`relational.ai_block`) and sorts what it says:

* conditions on one table with no AI call (comparisons, BETWEEN, IN, LIKE, IS NULL, NOT, OR, functions,
  subqueries) → that table's scan, so the rows they remove never reach the model;
* top-level AND-ed AI predicates, column equalities between tables, [NOT] EXISTS with an AI predicate,
  LEFT JOIN ... ON an AI predicate, `name IN (labels)` over an AI.CLASSIFY → model filters and joins;
* every other AI call → an AI output column (BOOLEAN, DOUBLE or VARCHAR), computed once per call;
* everything else → the relational tail, one DuckDB statement (`relational.py`), bound by DuckDB here,
  so a wrong name or type is a CompileError with its position before any model work.

What stays out of reach is refused by name, with its line and column and what to write instead.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import pyarrow as pa
from sqlglot import exp

from quail.data.providers import TableSchema
from quail.data.sources import quoted
from quail.errors import CompileError, GeneralRuleError, GeneralRuleOnly
from quail.frontend.aggregates import has_aggregates
from quail.frontend.calls import (
    call_value,
    classify_arguments,
    column_name,
    generate_arguments,
    is_plain_column,
    number,
    output_type,
    prompt_and_options,
    selectivity,
    string_option,
)
from quail.frontend.forms import canonical_calls, unused_options
from quail.frontend.models import NamedModel, block_models, named_models
from quail.frontend.relational import (
    INTERNAL_PREFIX,
    OUTPUTS_RELATION,
    References,
    Scope,
    ai_block,
    early_limit,
    output_column,
    relocated,
    rows_relation,
    visible_ctes,
    with_clause,
)
from quail.frontend.spec import (
    ClassifySpec,
    ColumnName,
    EqualitySpec,
    GenerateSpec,
    LabelFilterSpec,
    PredicateSpec,
    PromptSpec,
    QuerySpec,
    RelationalSpec,
    ScanCondition,
    ScoreSpec,
    SelectItem,
    TableSpec,
    VerdictSpec,
)
from quail.frontend.syntax import (
    DIALECTS,
    AiCall,
    Dialect,
    ai_call,
    ai_calls,
    beyond_one_block,
    conjuncts,
    fail_at,
    first_word,
    parse_one,
    refuse_unknown_args,
    safe_sql,
    unsupported,
    where_of,
)
from quail.frontend.tail import TailWriter
from quail.logical.expressions import ColumnRef, Comparison, PairCondition, ScoreThreshold

__all__ = ["DIALECTS", "Dialect", "ParsedStatement", "RelationalCatalog", "ai_call", "parse_sql", "parse_statement",
           "read_statement"]

MAX_ROWS = 2**63 - 1
"""The largest LIMIT / OFFSET a row count can reach (DuckDB's and Arrow's signed 64-bit lengths)."""
COMPARISONS: dict[type[exp.Expression], Comparison] = {exp.GTE: ">=", exp.GT: ">", exp.LTE: "<=", exp.LT: "<"}
FLIPPED: dict[Comparison, Comparison] = {">=": "<=", ">": "<", "<=": ">=", "<": ">"}
# What the AI block may carry; anything else sqlglot parsed is refused by name (an allow-list, so a
# construct we do not know is never silently ignored).
BLOCK_ARGS = {"expressions", "from_", "from", "joins", "where", "limit", "kind", "group", "having", "qualify",
              "order", "offset", "distinct", "windows"}
SUBQUERY_ARGS = {"expressions", "from_", "from", "where"}
JOIN_ARGS = {"this", "on", "kind", "side"}
TABLE_ARGS = {"this", "alias"}
LEFT_ON_HINT = ("LEFT JOIN ... ON takes one AI predicate over both tables, column equalities and other conditions "
                "between them, and conditions on the joined table; put other conditions in WHERE")


class RelationalCatalog(Protocol):
    """What the reader asks of the session's DuckDB: registered tables, and binding checks."""

    def schema(self, name: str) -> TableSchema | None: ...

    def describe(self, sql: str) -> pa.Schema: ...

    def check(self, sql: str, relations: Mapping[str, pa.Schema]) -> pa.Schema: ...


@dataclass(frozen=True)
class ParsedStatement:
    """The user's statement in the form the readers take (PROMPT form, known case), and the remarks it earns."""

    statement: exp.Query
    remarks: tuple[str, ...] = ()
    """Options accepted and of no use to Quail (`connection_id => …`), for explain()."""
    models: tuple[NamedModel, ...] = ()
    """The models its calls name (`frontend.models`), as written: the session resolves them."""


def parse_sql(text: str, catalog: RelationalCatalog, dialect: Dialect = "snowflake") -> QuerySpec:
    """Read one SELECT statement into a QuerySpec, or raise CompileError."""
    return read_parsed(parse_statement(text, catalog, dialect), text, catalog, dialect)


def read_parsed(parsed: ParsedStatement, text: str, catalog: RelationalCatalog, dialect: Dialect) -> QuerySpec:
    """A parsed user statement (`parse_statement`) read into a QuerySpec by the planner of one block; the reader
    rewrites the tree it reads, so it reads a copy (the general rule may take the statement next)."""
    try:
        return replace(_Reader(dialect, catalog, parsed.statement.copy(), text).read(), remarks=parsed.remarks)
    except RecursionError:
        raise CompileError("the query nests too deeply") from None


def parse_statement(text: str, catalog: RelationalCatalog, dialect: Dialect = "snowflake") -> ParsedStatement:
    """The user's one query statement, parsed and checked for names they may not use; CompileError otherwise."""
    if dialect not in DIALECTS:
        raise CompileError(f"unknown SQL dialect {dialect!r}; use 'snowflake' or 'bigquery'")
    parsed = parse_one(text, dialect)
    remarks = unused_options(parsed)
    statement = _known_case(canonical_calls(parsed), catalog)
    _refuse_internal_names(statement)
    if not isinstance(statement, exp.Query):
        raise CompileError(_not_a_query(text))
    return ParsedStatement(statement, remarks, named_models(statement))


def read_statement(statement: exp.Expression, catalog: RelationalCatalog, dialect: Dialect) -> QuerySpec:
    """A statement Quail wrote itself (a lookup's AI query, `lookups.py`) read into a QuerySpec: it may name
    Quail's own relations, which a user's text may not."""
    try:
        return _Reader(dialect, catalog, statement, safe_sql(statement, dialect)).read()
    except RecursionError:
        raise CompileError("the query nests too deeply") from None


def _not_a_query(text: str) -> str:
    """What a statement that parsed as something else starts with, and the keyword it may have meant."""
    word = first_word(text) or text.strip()[:12]
    close = difflib.get_close_matches(word.upper(), ["SELECT", "WITH"], n=1, cutoff=0.6)
    meant = f" (did you mean {close[0]}?)" if close else ""
    return f"not a SELECT statement: it starts with {word!r}{meant}; Quail runs one SELECT statement"


def _known_case(statement: exp.Expression, catalog: RelationalCatalog) -> exp.Expression:
    """Unquoted identifiers are case-insensitive in both dialects: `F.BODY` where the alias is `f`, `FROM REVIEWS`
    for the table registered as `reviews`. Each unquoted name that is not known as written but matches one known
    name (a registered table, its columns, an alias or CTE of the statement) when case is ignored is written as
    that name; quoted names keep their case."""
    known: dict[str, set[str]] = {}
    tables = getattr(catalog, "catalog", {})
    for name, schema in (tables.items() if isinstance(tables, Mapping) else []):
        for spelling in (name, *getattr(schema, "columns", ())):
            known.setdefault(spelling.lower(), set()).add(spelling)
    for node in statement.find_all(exp.TableAlias, exp.Alias, exp.CTE):
        alias = node.args.get("alias") if isinstance(node, exp.CTE) else node.args.get("alias") or node.this
        identifier = alias.this if isinstance(alias, exp.TableAlias) else alias
        if isinstance(identifier, exp.Identifier):
            known.setdefault(identifier.name.lower(), set()).add(identifier.name)
    exact = {spelling for spellings in known.values() for spelling in spellings}
    for identifier in statement.find_all(exp.Identifier):
        if identifier.quoted or identifier.name in exact or isinstance(identifier.parent, exp.Dot):
            continue
        spellings = known.get(identifier.name.lower(), set())
        if len(spellings) == 1:
            identifier.set("this", next(iter(spellings)))
    return statement


def _refuse_internal_names(statement: exp.Expression) -> None:
    """Quail's own relations (`__quail_rows_0`, `__quail`) are not the user's to read: the relational part runs
    beside them, and what they hold depends on the plan."""
    for identifier in statement.find_all(exp.Identifier):
        if identifier.name.lower().startswith(INTERNAL_PREFIX):
            raise fail_at(f"{identifier.name!r} is reserved for Quail's own relations; name a registered table, "
                          "a CTE or an alias of your own", identifier)


Clause = Literal["where", "on", "left_on"]
Register = Callable[[str], None]
"""Records an AI output's spec under the name it gets."""


@dataclass(frozen=True)
class _Context:
    """Where a condition stands: WHERE, the ON of an inner join of `alias`, or the ON of its LEFT JOIN."""

    clause: Clause
    alias: str | None = None
    visible: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Output:
    name: str
    kind: str
    type: pa.DataType


@dataclass
class _Reader:
    dialect: Dialect
    catalog: RelationalCatalog
    statement: exp.Expression
    text: str = ""
    block: exp.Select = field(init=False)
    scope: Scope = field(init=False)
    tables: list[TableSpec] = field(default_factory=list)
    hidden: dict[str, TableSpec] = field(default_factory=dict)
    tail_aliases: list[str] = field(default_factory=list)
    tail_joins: list[exp.Join] = field(default_factory=list)
    predicates: list[PredicateSpec] = field(default_factory=list)
    equalities: list[EqualitySpec] = field(default_factory=list)
    classifies: list[ClassifySpec] = field(default_factory=list)
    label_filters: list[LabelFilterSpec] = field(default_factory=list)
    scores: list[ScoreSpec] = field(default_factory=list)
    generates: list[GenerateSpec] = field(default_factory=list)
    verdicts: list[VerdictSpec] = field(default_factory=list)
    scan: list[tuple[ScanCondition, exp.Expression]] = field(default_factory=list)
    residual: list[exp.Expression] = field(default_factory=list)
    pair_conditions: list[PairCondition] = field(default_factory=list)
    left_conditions: list[tuple[str, PairCondition]] = field(default_factory=list)
    links: list[tuple[str, ...]] = field(default_factory=list)
    outputs: dict[tuple[object, ...], _Output] = field(default_factory=dict)
    satisfied: set[tuple[object, ...]] = field(default_factory=set)
    ctes_sql: str | None = None
    ctes: set[str] = field(default_factory=set)
    restated: bool = False
    """A SELECT item repeats a WHERE filter: the tail writes TRUE for it."""
    counter: itertools.count = field(default_factory=lambda: itertools.count(1))
    arrival: int = 0
    model: str | None = None

    # -- the statement --------------------------------------------------------------------------

    def read(self) -> QuerySpec:
        statement = self.statement
        if not isinstance(statement, exp.Query):
            raise CompileError(_not_a_query(self.text))
        if isinstance(statement, exp.Select) and not (statement.args.get("from_") or statement.args.get("from")):
            raise GeneralRuleError("the query has no FROM clause")
        if has_aggregates(statement):
            raise GeneralRuleOnly("AI aggregates answer per group: the general rule reads them")
        if any(call.kind == "embed" for call in ai_calls(statement)):
            raise GeneralRuleOnly("embeddings are values of distinct texts: the general rule reads them")
        models = block_models(statement)
        if len(models) > 1:
            raise GeneralRuleError(f"the AI calls of one query block answer with {len(models)} models "
                                   f"({', '.join(sorted(m or 'the session model' for m in models))}); an AI join "
                                   "and every AI call of its block answer with one")
        self.model = next(iter(models), None)
        self.block = ai_block(statement)
        allowed = BLOCK_ARGS | ({"with_", "with"} if self.block is statement else set())
        refuse_unknown_args(self.block, allowed, "write it in a query around the AI block, or in a CTE")
        self._check_limit()
        self._read_ctes()
        self.scope = Scope(self.block, hidden=_exists_aliases(self.block), outer=_outer_aliases(self.statement,
                                                                                                 self.block))
        pending_on = self._read_from()
        self._name_outputs()
        self._check_tail_aliases()
        for on, context in pending_on:
            self._read_condition(on, context)
        where = self.block.args.get("where")
        if where is not None:
            self._read_condition(where.this, _Context("where"))
        self._drop_satisfied_outputs()
        return self._spec()

    def _drop_satisfied_outputs(self) -> None:
        """A SELECT item that repeats a top-level WHERE filter is TRUE on every row: it needs no model work."""
        for key in [k for k in self.outputs if k in self.satisfied]:
            name = self.outputs.pop(key).name
            self.verdicts = [v for v in self.verdicts if v.output != name]
            self.restated = True

    def _check_limit(self) -> None:
        limit = self.block.args.get("limit")
        value = limit.args.get("expression") if isinstance(limit, exp.Limit) else None
        if isinstance(value, exp.Literal) and not value.is_string and not value.this.isdigit():
            raise unsupported("LIMIT with a non-integer value", limit, "write LIMIT n")
        for clause in self.statement.find_all(exp.Limit, exp.Offset):
            count = clause.args.get("expression")
            if isinstance(count, exp.Literal) and not count.is_string and count.this.isdigit() and (
                    int(count.this) > MAX_ROWS):
                word = "LIMIT" if isinstance(clause, exp.Limit) else "OFFSET"
                raise fail_at(f"{word} {count.this} is larger than any row count (at most {MAX_ROWS:,})", clause)

    def _read_ctes(self) -> None:
        ctes = visible_ctes(self.statement, self.block)
        with_ = self.statement.args.get("with_") or self.statement.args.get("with")
        self.ctes = {cte.alias for cte in ctes}
        self.ctes_sql = with_clause(ctes, bool(with_ is not None and with_.args.get("recursive")))

    def _spec(self) -> QuerySpec:
        simple = self._simple()
        select: list[SelectItem] = []
        relational = None
        limit = None
        scan_order = None
        if simple:
            select = [self._select_item(item) for item in self.block.expressions]
            limit = _literal_limit(self.block)
        else:
            scan_order = self._scan_order()
            limit, note = early_limit(self.statement, self.block, bool(self.residual), bool(self.tail_joins),
                                      scan_order is not None)
            if limit is None:
                scan_order = None
            relational = self._write_tail(note)
        self._check_scan_conditions()
        return QuerySpec(
            tables=tuple(self.tables), select=tuple(select), predicates=tuple(self.predicates),
            equalities=tuple(self.equalities), classifies=tuple(self.classifies),
            label_filters=tuple(self.label_filters), scores=tuple(self.scores), limit=limit,
            generates=tuple(self.generates),
            verdicts=tuple(self.verdicts), scan=tuple(condition for condition, _ in self.scan),
            links=tuple(self.links), ctes=self.ctes_sql, relational=relational,
            pair_conditions=tuple(self.pair_conditions), scan_order=scan_order,
            left_conditions=tuple(self.left_conditions), model=self.model,
        )

    def order_of(self, node: exp.Expression) -> int:
        """Written order: the character offset sqlglot recorded for the call, else arrival order."""
        self.arrival += 1
        for item in node.walk():
            if "start" in item.meta:
                return int(item.meta["start"]) * 1000 + self.arrival
        return 10**12 + self.arrival

    # -- FROM and JOIN --------------------------------------------------------------------------

    def _read_from(self) -> list[tuple[exp.Expression, _Context]]:
        """Every table of the block; the ON clauses, to read once every name is known."""
        source = self.block.args.get("from_") or self.block.args.get("from")
        if source is None:
            raise GeneralRuleError("the query has no FROM clause")
        self._add_table(source.this, "from")
        pending: list[tuple[exp.Expression, _Context]] = []
        for join in self.block.args.get("joins") or []:
            pending.extend(self._read_join(join))
        return pending

    def _read_join(self, join: exp.Join) -> list[tuple[exp.Expression, _Context]]:
        if join.args.get("using"):
            raise beyond_one_block("JOIN ... USING", join, "write ON a.x = b.y")
        refuse_unknown_args(join, JOIN_ARGS)
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if side == "RIGHT":
            raise beyond_one_block("RIGHT OUTER JOIN", join, "write it as a LEFT JOIN with the tables swapped")
        if side == "FULL":
            raise beyond_one_block("FULL OUTER JOIN", join, "join in a CTE without AI functions and read that")
        if kind and kind not in ("CROSS", "INNER", "OUTER"):
            raise beyond_one_block(f"{kind} JOIN", join)
        on = join.args.get("on")
        before = frozenset(self.scope.columns)
        if side == "LEFT":
            if on is None or not ai_calls(on):
                self._add_tail_join(join)
                return []
            spec = self._add_table(join.this, "left")
            return [(on, _Context("left_on", spec.alias, before | {spec.alias}))]
        spec = self._add_table(join.this, "from")
        return [] if on is None else [(on, _Context("on", spec.alias, before | {spec.alias}))]

    def _add_table(self, node: exp.Expression, role: Literal["from", "left", "exists", "anti"],
                   visible: bool = True) -> TableSpec:
        spec = self._table(node, role)
        if spec.alias in self.scope.columns or spec.alias in self.hidden:
            raise fail_at(f"alias {spec.alias!r} is used for two tables", node)
        if spec.alias.startswith(INTERNAL_PREFIX):
            raise fail_at(f"alias {spec.alias!r} is reserved for Quail's own relations; pick another alias", node)
        self.tables.append(spec)
        schema = self._schema_of(spec)
        if visible:
            self.scope.add(spec.alias, spec.table, schema.columns)
        else:
            self.hidden[spec.alias] = spec
        return spec

    def _add_tail_join(self, join: exp.Join) -> None:
        """A LEFT JOIN with no AI call in its ON: DuckDB runs it in the tail, the model never sees its table."""
        spec = self._table(join.this, "left")
        if spec.alias in self.scope.columns:
            raise fail_at(f"alias {spec.alias!r} is used for two tables", join.this)
        self.scope.add(spec.alias, spec.table, self._schema_of(spec).columns)
        self.tail_aliases.append(spec.alias)
        self.tail_joins.append(join)

    def _table(self, node: exp.Expression, role: Literal["from", "left", "exists", "anti"]) -> TableSpec:
        where = where_of(node)
        if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Query):
            if not node.alias:  # Snowflake and DuckDB allow it: its columns are named bare
                node.set("alias", exp.TableAlias(this=exp.to_identifier(self._unused_alias())))
            refuse_unknown_args(node, TABLE_ARGS)
            source = f"({node.this.sql(dialect='duckdb')})"
            return self._derived(TableSpec("(subquery)", node.alias, role, where, source), node)
        if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
            raise beyond_one_block(f"{node.key.upper()} in FROM", node, "name a registered table, a CTE or a subquery")
        if node.args.get("db") or node.args.get("catalog"):
            raise unsupported(f"qualified table name {safe_sql(node)}", node, "name a registered table")
        refuse_unknown_args(node, TABLE_ARGS | {"db", "catalog"})
        alias = node.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            raise unsupported("column aliases in a table alias", node)
        if node.name in self.ctes:
            return self._derived(TableSpec(node.name, node.alias_or_name, role, where, quoted(node.name)), node)
        if self.catalog.schema(node.name) is None:
            known = ", ".join(sorted(self._registered())) or "none"
            raise fail_at(f"unknown table {node.name!r}; registered tables: {known}", node)
        return TableSpec(node.name, node.alias_or_name, role, where)

    def _unused_alias(self) -> str:
        """A name for a derived table written without one, unlike any alias or table of the statement."""
        taken = {i.name.lower() for i in self.statement.find_all(exp.Identifier)}
        return next(f"subquery_{n}" for n in itertools.count(1) if f"subquery_{n}" not in taken)

    def _registered(self) -> list[str]:
        names = getattr(self.catalog, "catalog", {})
        return list(names) if isinstance(names, Mapping) else []

    def _derived(self, spec: TableSpec, node: exp.Expression) -> TableSpec:
        head = f"{self.ctes_sql} " if self.ctes_sql else ""
        try:
            arrow = self.catalog.describe(f"{head}SELECT * FROM {spec.source}")
        except CompileError as error:
            raise relocated(error, node, f"{spec.table} AS {spec.alias}: ") from None
        return TableSpec(spec.table, spec.alias, spec.role, spec.where, spec.source,
                         TableSchema(spec.table, tuple(arrow.names), None, arrow))

    def _schema_of(self, spec: TableSpec) -> TableSchema:
        schema = spec.schema or self.catalog.schema(spec.table)
        assert schema is not None
        return schema

    def _check_tail_aliases(self) -> None:
        for call in ai_calls(self.block):
            read = {self.scope.alias_of(c) for c in call.node.find_all(exp.Column)} & set(self.tail_aliases)
            if read:
                alias = sorted(read)[0]
                raise beyond_one_block(f"an AI function over {alias!r}, which is LEFT JOINed without an AI predicate",
                                  call.node, f"join {alias!r} with an inner JOIN, or in a CTE the AI block reads")

    @property
    def model_aliases(self) -> list[str]:
        """The aliases whose rows the model's result holds, in FROM order."""
        return [t.alias for t in self.tables if t.role in ("from", "left")]

    def _nullable(self, alias: str) -> bool:
        return alias in self.tail_aliases or any(t.alias == alias and t.role == "left" for t in self.tables)

    # -- AI outputs ----------------------------------------------------------------------------

    def _name_outputs(self) -> None:
        """SELECT-list names first: `AI.SCORE(...) AS s` makes an output named s."""
        for item in self.block.expressions:
            if isinstance(item, exp.Alias):
                self.scope.outputs.add(item.alias)
                call = ai_call(item.this)
                if call is None:
                    continue
                self._output(call, item.alias)
                names = [o.name for o in self.outputs.values()]
                if len(set(names)) < len(names):
                    raise fail_at("two AI outputs share one name; give each AI.CLASSIFY / AI.SCORE its own AS name",
                                  item)

    def _output(self, call: AiCall, name: str | None = None) -> _Output:
        """The output column of an AI call: one per distinct call, named by its SELECT alias when it has one."""
        key, register = self._output_spec(call)
        found = self.outputs.get(key)
        if found is not None:
            return found
        output = _Output(name or self._fresh_name(call.kind), call.kind, output_type(call))
        register(output.name)
        self.outputs[key] = output
        return output

    def _output_spec(self, call: AiCall) -> tuple[tuple[object, ...], Register]:
        order, where = self.order_of(call.node), where_of(call.node)
        if call.kind == "classify":
            prompt, labels, instructions = classify_arguments(call)
            key: tuple[object, ...] = ("classify", self._prompt_key(prompt), labels, instructions)
            return key, lambda name: self.classifies.append(
                ClassifySpec(prompt, labels, name, order, instructions, where))
        if call.kind == "generate":
            prompt, max_tokens, schema = generate_arguments(call)
            return ("generate", self._prompt_key(prompt), max_tokens, schema), lambda name: self.generates.append(
                GenerateSpec(prompt, name, order, max_tokens, schema, where))
        if call.kind == "score":
            prompt, _ = prompt_and_options(call, set())
            return ("score", self._prompt_key(prompt)), lambda name: self.scores.append(
                ScoreSpec(prompt, name, order, where))
        prompt, options = prompt_and_options(call, {"selectivity"})
        chosen = selectivity(options)
        return ("filter", self._prompt_key(prompt)), lambda name: self.verdicts.append(
            VerdictSpec(prompt, name, order, chosen, where))

    def _prompt_key(self, prompt: PromptSpec) -> tuple[object, ...]:
        """What makes two calls the same question: template, arguments and examples (the same words with other
        examples are another prompt, answered apart)."""
        return (prompt.template, tuple((a.qualifier, a.name) for a in prompt.arguments), prompt.examples,
                prompt.symmetric)

    def _fresh_name(self, kind: str) -> str:
        taken = {o.name for o in self.outputs.values()} | set(self.scope.columns) | self.scope.outputs
        while True:
            name = f"ai_{'if' if kind == 'filter' else kind}_{next(self.counter)}"
            if name not in taken:
                return name

    def _call_aliases(self, call: AiCall) -> set[str]:
        found = set()
        for argument in call.node.find_all(exp.Column):
            alias = self.scope.alias_of(argument)
            if alias is not None:
                found.add(alias)
        return found

    # -- conditions (WHERE and ON) --------------------------------------------------------------

    def _read_condition(self, node: exp.Expression, context: _Context) -> None:
        for conjunct in conjuncts(node):
            self._read_conjunct(conjunct, context)

    def _read_conjunct(self, node: exp.Expression, context: _Context) -> None:
        if isinstance(node, exp.Boolean) and node.this is True:
            return
        call = ai_call(node)
        if call is not None:
            self._read_ai_condition(call, context)
        elif type(node) in COMPARISONS and self._score_threshold(node) is not None:
            self._read_score_condition(node, context)
        elif _is_exists(node) and ai_calls(node):
            self._read_exists(node, context)
        elif self._read_label_filter(node, context) or self._read_equality(node, context):
            return
        elif ai_calls(node):
            self._residual(node, context)
        else:
            self._read_plain(node, context)

    def _model_ready(self, aliases: set[str], context: _Context) -> bool:
        """Can a predicate over these aliases run as a model filter or join here?"""
        if context.clause == "left_on":
            return context.alias in aliases and not any(self._nullable(a) for a in aliases - {context.alias})
        return not any(self._nullable(a) for a in aliases)

    def _read_ai_condition(self, call: AiCall, context: _Context) -> None:
        if call.kind != "filter":
            raise unsupported(f"{call.spelling} as a condition", call.node,
                              "compare AI.SCORE with a number, or name AI.CLASSIFY in SELECT and filter with IN")
        aliases = self._call_aliases(call)
        if not self._model_ready(aliases, context):
            self._residual(call.node, context)
            return
        prompt, options = prompt_and_options(call, {"selectivity", "anchor"})
        self._predicate(PredicateSpec(prompt, self.order_of(call.node), selectivity(options),
                                      string_option(options, "anchor"), None, None, None, where_of(call.node)),
                        context)
        if context.clause != "left_on":
            self.satisfied.add(("filter", self._prompt_key(prompt)))

    def _predicate(self, spec: PredicateSpec, context: _Context) -> None:
        if context.clause == "left_on":
            spec = PredicateSpec(spec.prompt, spec.order, spec.selectivity, spec.anchor, spec.threshold, None,
                                 context.alias, spec.where)
        elif context.clause == "on":
            spec = PredicateSpec(spec.prompt, spec.order, spec.selectivity, spec.anchor, spec.threshold,
                                 context.alias, None, spec.where)
        self.predicates.append(spec)

    def _score_threshold(self, node: exp.Expression) -> tuple[AiCall, Comparison, float] | None:
        """`AI.SCORE(...) <op> number` (either side): the call, the comparison with the call on the left, the number."""
        op = COMPARISONS[type(node)]
        left, right = ai_call(node.this), ai_call(node.expression)
        if left is not None and left.kind == "score" and right is None:
            value = number(node.expression)
            return None if value is None else (left, op, value)
        if right is not None and right.kind == "score" and left is None:
            value = number(node.this)
            return None if value is None else (right, FLIPPED[op], value)
        return None

    def _read_score_condition(self, node: exp.Expression, context: _Context) -> None:
        found = self._score_threshold(node)
        assert found is not None
        call, op, value = found
        if not self._model_ready(self._call_aliases(call), context):
            self._residual(node, context)
            return
        prompt, options = prompt_and_options(call, {"selectivity", "anchor"})
        self._predicate(PredicateSpec(prompt, self.order_of(call.node), selectivity(options),
                                      string_option(options, "anchor"), ScoreThreshold(op, value), None, None,
                                      where_of(call.node)), context)

    def _read_label_filter(self, node: exp.Expression, context: _Context) -> bool:
        """`name IN ('a', ...)` over a named AI.CLASSIFY output, at the top of WHERE: the model keeps those labels."""
        if context.clause != "where" or not isinstance(node, exp.In) or node.args.get("query") is not None:
            return False
        if node.args.get("unnest") is not None or node.args.get("field") is not None:
            return False
        target = node.this
        if not (is_plain_column(target) and not target.table):
            return False
        outputs = {o.name for key, o in self.outputs.items() if key[0] == "classify"}
        if target.name not in outputs or any(target.name in c for c in self.scope.columns.values()):
            return False
        if not all(isinstance(v, exp.Literal) and v.is_string for v in node.expressions):
            return False
        values = tuple(v.this for v in node.expressions)
        self.label_filters.append(LabelFilterSpec(target.name, values, where_of(node)))
        return True

    def _read_equality(self, node: exp.Expression, context: _Context) -> bool:
        """`a.x = b.y` between two tables of the model: it restricts the pairs a join evaluates."""
        if not isinstance(node, exp.EQ) or not (is_plain_column(node.this) and is_plain_column(node.expression)):
            return False
        aliases = {self.scope.alias_of(node.this), self.scope.alias_of(node.expression)}
        if None in aliases or len(aliases) != 2:
            return False
        known = {a for a in aliases if a is not None}
        if not self._model_ready(known, context):
            return False
        if context.clause == "left_on":
            subquery_of, on_of = context.alias, None
        else:
            subquery_of, on_of = None, context.alias if context.clause == "on" else None
        self.equalities.append(EqualitySpec(column_name(node.this), column_name(node.expression), on_of,
                                            where_of(node), subquery_of))
        return True

    def _read_plain(self, node: exp.Expression, context: _Context) -> None:
        """A condition without AI calls: at one table's scan when it reads one table, else in the tail."""
        references = self.scope.references(node)
        self._check_visible(references.aliases, context, node)
        alias = self._scan_alias(references.aliases, context) if not references.outputs else None
        if alias is not None:
            self.scan.append((ScanCondition(alias, node.sql(dialect="duckdb"), where_of(node)), node))
            return
        if context.clause == "left_on":
            self.left_conditions.append((context.alias or "", self._left_condition(node, references, context)))
            return
        self._residual(node, context)
        pair = self._pair_condition(node, references, context)
        if pair is not None:
            self.pair_conditions.append(pair)

    def _scan_order(self) -> tuple[str, str] | None:
        """(alias, keys) when ORDER BY reads plain columns of the one table the model reads, and nothing else."""
        order = self.block.args.get("order")
        if order is None or len(self.model_aliases) != 1 or self.tail_joins:
            return None
        (alias,) = self.model_aliases
        keys = []
        for ordered in order.expressions:
            key = ordered.this
            if not is_plain_column(key) or self.scope.alias_of(key) != alias:
                return None
            actual = next((c for c in self.scope.columns.get(alias, ()) if c.lower() == key.name.lower()), None)
            if actual is None or self._nullable(alias):
                return None
            keys.append(exp.Ordered(this=exp.column(actual, table=alias, quoted=True), desc=ordered.args.get("desc"),
                                    nulls_first=ordered.args.get("nulls_first")))
        return alias, ", ".join(key.sql(dialect="duckdb") for key in keys)

    def _left_condition(self, node: exp.Expression, references: References, context: _Context) -> PairCondition:
        """A condition of a LEFT JOIN's ON between its table and one joined before it (`p1.id <> p2.id`): it decides,
        with the AI predicate, which pairs match — before the unmatched rows are NULL-extended — so the pairs the
        model is asked are the ones it allows."""
        joined = context.alias or ""
        pair = None
        if joined in references.aliases and len(references.aliases) == 2:
            other = next(a for a in references.aliases if a != joined)
            if other in self.model_aliases and not self._nullable(other):
                pair = self._pair_condition(node, references, context, outer=joined)
        if pair is None:
            raise beyond_one_block(f"condition {safe_sql(node, self.dialect)} in LEFT JOIN ... ON", node, LEFT_ON_HINT)
        return pair

    def _pair_condition(self, node: exp.Expression, references: References,
                        context: _Context, outer: str | None = None) -> PairCondition | None:
        """A plain condition over exactly two tables of the model, neither NULL-extended (but `outer`, the table of
        the LEFT JOIN whose ON it is), with no subquery, aggregate or window: it can also restrict the pairs a join
        between them asks (from WHERE or an inner ON it stays in the tail as well)."""
        clauses = ("left_on",) if outer is not None else ("where", "on")
        if context.clause not in clauses or references.outputs or len(references.aliases) != 2:
            return None
        nullable = [a for a in references.aliases if a != outer and self._nullable(a)]
        if not set(references.aliases) <= set(self.model_aliases) or nullable:
            return None
        if node.find(exp.Subquery, exp.Select, exp.AggFunc, exp.Window, exp.Placeholder) is not None:
            return None
        columns: list[ColumnRef] = []
        written = node.copy()
        # The columns are resolved where the statement has them (an unqualified one needs its SELECT around it to
        # find its table), then renamed in the copy: both walks meet the columns in the same order.
        for original, copied in zip(list(node.find_all(exp.Column)), list(written.find_all(exp.Column)), strict=True):
            alias = self.scope.alias_of(original)
            actual = next((c for c in self.scope.columns.get(alias or "", ()) if c.lower() == original.name.lower()),
                          None)
            if alias is None or actual is None:
                return None
            if ColumnRef(alias, actual) not in columns:
                columns.append(ColumnRef(alias, actual))
            renamed = exp.column(f"{alias}.{actual}", quoted=True)
            if copied is written:
                written = renamed
            else:
                copied.replace(renamed)
        return PairCondition(written.sql(dialect="duckdb"), tuple(columns))

    def _scan_alias(self, aliases: frozenset[str], context: _Context) -> str | None:
        if context.clause == "left_on":
            return context.alias if aliases <= {context.alias} else None
        if len(aliases) > 1:
            return None
        if not aliases:
            return context.alias or self.model_aliases[0]
        (alias,) = aliases
        return None if self._nullable(alias) else alias

    def _check_visible(self, aliases: frozenset[str], context: _Context, node: exp.Expression) -> None:
        late = sorted(aliases - context.visible) if context.clause != "where" else []
        if late:
            raise fail_at(f"the ON clause of {context.alias!r} refers to {late[0]!r}, which is joined later", node)

    def _residual(self, node: exp.Expression, context: _Context) -> None:
        if context.clause == "left_on":
            raise beyond_one_block(f"condition {safe_sql(node, self.dialect)} in LEFT JOIN ... ON", node, LEFT_ON_HINT)
        _check_score_comparisons(node)
        references = self.scope.references(node)
        self._check_visible(references.aliases, context, node)
        model = tuple(sorted(a for a in references.aliases if a in self.model_aliases))
        if len(model) > 1:
            self.links.append(model)
        self.residual.append(node)

    # -- [NOT] EXISTS with an AI predicate -----------------------------------------------------

    def _read_exists(self, node: exp.Expression, context: _Context) -> None:
        negated = isinstance(node, exp.Not)
        exists = node.this if negated else node
        if context.clause != "where":
            raise unsupported("EXISTS with an AI predicate in an ON clause", node, "put it in WHERE")
        query = exists.this
        if not isinstance(query, exp.Select):
            raise unsupported("EXISTS over a non-SELECT", node)
        if query.args.get("joins"):
            raise beyond_one_block("JOIN inside EXISTS", query, "an EXISTS subquery reads one table")
        refuse_unknown_args(query, SUBQUERY_ARGS, "an EXISTS subquery with an AI predicate reads one table")
        source = query.args.get("from_") or query.args.get("from")
        if source is None:
            raise beyond_one_block("EXISTS without FROM", query)
        if any(_is_exists(inner) for inner in query.find_all(exp.Exists, exp.Not) if inner is not exists):
            raise beyond_one_block("nested EXISTS", node)
        spec = self._add_table(source.this, "anti" if negated else "exists", visible=False)
        where = query.args.get("where")
        if where is None:
            raise unsupported("EXISTS without an AI predicate", query, "add WHERE AI_FILTER(PROMPT(...))")
        inner = _Inner(self, spec, query)
        for conjunct in conjuncts(where.this):
            inner.read(conjunct)

    # -- SELECT list, simple shape --------------------------------------------------------------

    def _simple(self) -> bool:
        """A plain projection (what the builder can say): the compiler writes its statement itself."""
        block = self.block
        if block is not self.statement or self.residual or self.tail_joins or self.restated:
            return False
        if any(block.args.get(key) for key in ("group", "having", "qualify", "order", "distinct", "windows",
                                               "offset")):
            return False
        limit = block.args.get("limit")
        if limit is not None and _literal_limit(block) is None:
            return False
        named = {o.name for o in self.outputs.values()}
        for item in block.expressions:
            if isinstance(item, exp.Alias) and ai_call(item.this) is not None and item.alias in named:
                continue
            if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                star = item if isinstance(item, exp.Star) else item.this
                if any(star.args.get(k) for k in star.args):
                    return False
                continue
            if not is_plain_column(item):
                return False
        return len(self.outputs) == len({o.name for o in self.outputs.values()}) and all(
            any(isinstance(i, exp.Alias) and i.alias == o.name for i in block.expressions)
            for o in self.outputs.values())

    def _select_item(self, item: exp.Expression) -> SelectItem:
        if isinstance(item, exp.Star):
            return SelectItem("star", where=where_of(item))
        if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            return SelectItem("alias_star", alias=item.table, where=where_of(item))
        if isinstance(item, exp.Alias):
            return SelectItem("output", output=item.alias, where=where_of(item))
        return SelectItem("column", column=column_name(item), where=where_of(item))

    # -- the relational tail --------------------------------------------------------------------

    def _write_tail(self, note: str | None) -> RelationalSpec:
        """The statement rewritten for DuckDB (tail.py), bound by DuckDB here: the block reads the model's rows."""
        writer = TailWriter(self.statement, self.block, self.scope, self.dialect, self._ai_value)
        statement = writer.write(self.residual, self.model_aliases, self.tail_aliases, self.tail_joins,
                                 lambda: bool(self.outputs))
        self._check_tail(statement)
        return RelationalSpec(statement, tuple(self.model_aliases), writer.reads(self.model_aliases),
                              tuple(o.name for o in self.outputs.values()), (note,) if note else ())

    def _ai_value(self, call: AiCall) -> exp.Expression:
        """An AI call outside the model's filters and joins: its output column, or TRUE where WHERE holds it."""
        if call.kind == "filter":
            prompt, _ = prompt_and_options(call, {"selectivity", "anchor"})
            if ("filter", self._prompt_key(prompt)) in self.satisfied:
                return exp.true()
        aliases = self._call_aliases(call)
        if len(aliases) != 1:
            raise beyond_one_block(f"{call.spelling} over {len(aliases)} tables outside the top-level AND of WHERE "
                                   "and ON", call.node, "an AI value (in OR, NOT, CASE, SELECT, ...) reads one table")
        return call_value(call, output_column(self._output(call).name))

    def _check_tail(self, statement: str) -> None:
        relations: dict[str, pa.Schema] = {}
        for index, alias in enumerate(self.model_aliases):
            schema = self._schema_of(next(t for t in self.tables if t.alias == alias))
            assert schema.arrow is not None
            relations[rows_relation(index)] = schema.arrow
        if self.outputs:
            relations[OUTPUTS_RELATION] = pa.schema([(o.name, o.type) for o in self.outputs.values()])
        try:
            self.catalog.check(statement, relations)
        except CompileError as error:
            raise relocated(error, self.statement) from None

    def _check_scan_conditions(self) -> None:
        head = f"{self.ctes_sql} " if self.ctes_sql else ""
        for condition, node in self.scan:
            table = next(t for t in self.tables if t.alias == condition.alias)
            source = table.source or quoted(table.table)
            try:
                self.catalog.describe(f"{head}SELECT * FROM {source} AS {quoted(table.alias)} WHERE {condition.sql}")
            except CompileError as error:
                raise relocated(error, node) from None


@dataclass
class _Inner:
    """The WHERE of an [NOT] EXISTS subquery: its AI predicates, equalities, and conditions on its table."""

    reader: _Reader
    spec: TableSpec
    query: exp.Select

    def alias_of(self, column: exp.Column) -> str | None:
        inner = self.spec.alias
        if column.table == inner:
            return inner
        if not column.table and column.name in self.reader._schema_of(self.spec).columns:
            return inner
        if column.find_ancestor(exp.Select) is not self.query:
            return None
        return self.reader.scope.alias_of(column)

    def aliases(self, node: exp.Expression) -> set[str]:
        return {a for a in (self.alias_of(c) for c in node.find_all(exp.Column)) if a is not None}

    def read(self, node: exp.Expression) -> None:
        reader, alias = self.reader, self.spec.alias
        call = ai_call(node)
        if call is not None and call.kind == "filter":
            self._check_outer(self.aliases(call.node), node)
            prompt, options = prompt_and_options(call, {"selectivity", "anchor"})
            reader.predicates.append(PredicateSpec(prompt, reader.order_of(call.node), selectivity(options),
                                                   string_option(options, "anchor"), None, None, alias,
                                                   where_of(call.node)))
        elif type(node) in COMPARISONS and reader._score_threshold(node) is not None:
            found = reader._score_threshold(node)
            assert found is not None
            score, op, value = found
            self._check_outer(self.aliases(score.node), node)
            prompt, options = prompt_and_options(score, {"selectivity", "anchor"})
            reader.predicates.append(PredicateSpec(prompt, reader.order_of(score.node), selectivity(options),
                                                   string_option(options, "anchor"), ScoreThreshold(op, value),
                                                   None, alias, where_of(score.node)))
        elif isinstance(node, exp.EQ) and is_plain_column(node.this) and is_plain_column(node.expression):
            self._check_outer(self.aliases(node), node)
            reader.equalities.append(EqualitySpec(self._named(node.this), self._named(node.expression), None,
                                                  where_of(node), alias))
        elif not ai_calls(node) and self.aliases(node) <= {alias}:
            reader.scan.append((ScanCondition(alias, node.sql(dialect="duckdb"), where_of(node)), node))
        elif isinstance(node, exp.Boolean) and node.this is True:
            return
        else:
            raise beyond_one_block(
                f"condition {safe_sql(node, reader.dialect)}", node,
                "an EXISTS subquery holds AND-ed AI predicates, column equalities and conditions on its own table",
            )

    def _named(self, node: exp.Expression) -> ColumnName:
        """The column as written; a bare inner column is qualified, so the compiler resolves it inside."""
        name = column_name(node)
        if name.qualifier is None and self.alias_of(node) == self.spec.alias:
            return ColumnName(self.spec.alias, name.name, name.where)
        return name

    def _check_outer(self, aliases: set[str], node: exp.Expression) -> None:
        outer = aliases - {self.spec.alias}
        nullable = [a for a in outer if self.reader._nullable(a)]
        if nullable:
            raise beyond_one_block(f"EXISTS over {nullable[0]!r}, which is LEFT JOINed", node, "test it in a CTE")


def _outer_aliases(statement: exp.Expression, block: exp.Select) -> set[str]:
    """Aliases of tables outside the AI block: reading one would make it a correlated subquery."""
    inside = {id(node) for node in block.walk()}
    return {t.alias_or_name for t in statement.find_all(exp.Table, exp.Subquery)
            if id(t) not in inside and t.alias_or_name}


def _check_score_comparisons(node: exp.Expression) -> None:
    """AI.SCORE compared with text that is no number: DuckDB would find out only while running the
    relational part, after the model answered; say it now."""
    for comparison in node.find_all(exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ):
        sides = (comparison.this, comparison.expression)
        for mine, other in (sides, sides[::-1]):
            call = ai_call(mine)
            if call is None or call.kind != "score" or not (isinstance(other, exp.Literal) and other.is_string):
                continue
            try:
                float(other.this)
            except ValueError:
                raise unsupported(f"comparison of {call.spelling} with {other.sql()}", other,
                                  "AI.SCORE is a number in [0, 1]: compare it with a number") from None


def _exists_aliases(block: exp.Select) -> set[str]:
    """Aliases of the tables in the block's EXISTS subqueries: visible only inside them."""
    hidden = set()
    for exists in block.find_all(exp.Exists):
        query = exists.this
        source = query.args.get("from_") or query.args.get("from") if isinstance(query, exp.Select) else None
        if source is not None and isinstance(source.this, exp.Table) and exists.find_ancestor(exp.Select) is block:
            hidden.add(source.this.alias_or_name)
    return hidden


def _is_exists(node: exp.Expression) -> bool:
    return isinstance(node, exp.Exists) or (isinstance(node, exp.Not) and isinstance(node.this, exp.Exists))


def _literal_limit(select: exp.Select) -> int | None:
    limit = select.args.get("limit")
    if limit is None:
        return None
    if isinstance(limit, exp.Fetch):
        return None
    value = limit.args.get("expression")
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    return None

