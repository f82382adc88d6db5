"""The SQL front end: sqlglot parses, this module reads the tree into a QuerySpec.

Snowflake spells AI predicates `AI_FILTER(...)`, `AI_CLASSIFY(...)`; BigQuery `AI.IF(...)`,
`AI.CLASSIFY(...)`, `AI.SCORE(...)`. Both are normalised to one `_AiCall` before anything else, so
there is one reader for both dialects. Every refusal is a CompileError naming the construct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.dialects.bigquery import BigQuery
from sqlglot.dialects.snowflake import Snowflake
from sqlglot.errors import ParseError, TokenError

from quail.errors import CompileError
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
    TableSpec,
    Where,
)
from quail.logical.expressions import Comparison, Label, ScoreThreshold

Dialect = Literal["snowflake", "bigquery"]
AiKind = Literal["filter", "classify", "score"]


class QuailBigQuery(BigQuery):
    """BigQuery, except that `IF(...)` stays a plain call so `AI.IF(prompt)` parses."""

    class Parser(BigQuery.Parser):
        FUNCTIONS = {  # noqa: RUF012 - sqlglot's own extension point is a class attribute
            **BigQuery.Parser.FUNCTIONS,
            "IF": lambda args: exp.Anonymous(this="IF", expressions=args),
        }


DIALECTS: dict[str, type[sqlglot.Dialect]] = {"snowflake": Snowflake, "bigquery": QuailBigQuery}
SNOWFLAKE_NAMES: dict[str, AiKind] = {"AI_FILTER": "filter", "AI_CLASSIFY": "classify", "AI_SCORE": "score"}
BIGQUERY_NAMES: dict[str, AiKind] = {"IF": "filter", "CLASSIFY": "classify", "SCORE": "score"}
COMPARISONS: dict[type[exp.Expression], Comparison] = {exp.GTE: ">=", exp.GT: ">", exp.LTE: "<=", exp.LT: "<"}
FLIPPED: dict[Comparison, Comparison] = {">=": "<=", ">": "<", "<=": ">=", "<": ">"}
# What a SELECT may carry; anything else sqlglot parsed is refused by name (an allow-list, so a
# construct we do not know is never silently ignored).
SELECT_ARGS = {"expressions", "from_", "from", "joins", "where", "limit", "kind"}
SUBQUERY_ARGS = {"expressions", "from_", "from", "where"}
JOIN_ARGS = {"this", "on", "kind"}
TABLE_ARGS = {"this", "alias"}
CLAUSE_NAMES = {
    "with_": "WITH (common table expressions)", "with": "WITH (common table expressions)",
    "group": "GROUP BY", "having": "HAVING", "order": "ORDER BY", "distinct": "DISTINCT",
    "qualify": "QUALIFY", "offset": "OFFSET", "windows": "WINDOW", "into": "SELECT ... INTO",
    "connect": "CONNECT BY", "sample": "TABLESAMPLE", "pivots": "PIVOT / UNPIVOT", "laterals": "LATERAL",
    "exclude": "SELECT * EXCLUDE", "sort": "SORT BY", "cluster": "CLUSTER BY", "distribute": "DISTRIBUTE BY",
    "prewhere": "PREWHERE", "settings": "SETTINGS", "format": "FORMAT", "locks": "FOR UPDATE / SHARE",
    "match": "MATCH_RECOGNIZE", "method": "NATURAL / ASOF join", "match_condition": "MATCH_CONDITION",
    "using": "JOIN ... USING", "side": "OUTER JOIN", "version": "time travel (AT / BEFORE)",
    "hint": "query hints", "hints": "table hints", "options": "OPTION (...)", "for_": "FOR XML / JSON",
    "operation_modifiers": "operation modifiers", "joins": "joins inside a table reference",
    "except_": "SELECT * EXCLUDE / EXCEPT", "replace": "SELECT * REPLACE", "rename": "SELECT * RENAME",
    "ilike": "SELECT * ILIKE",
}


def parse_sql(text: str, dialect: Dialect = "snowflake") -> QuerySpec:
    """Read one SELECT statement into a QuerySpec, or raise CompileError."""
    if dialect not in DIALECTS:
        raise CompileError(f"unknown SQL dialect {dialect!r}; use 'snowflake' or 'bigquery'")
    statement = _parse_one(text, dialect)
    try:
        return _Reader(dialect).read(statement)
    except RecursionError:
        raise CompileError("the query nests too deeply") from None


def _parse_one(text: str, dialect: Dialect) -> exp.Expression:
    try:
        statements = [s for s in sqlglot.parse(text, read=DIALECTS[dialect]) if s is not None]
    except ParseError as error:
        first = error.errors[0] if error.errors else {}
        raise CompileError(f"syntax error: {first.get('description', error)}", line=first.get("line"),
                           column=first.get("col")) from None
    except TokenError as error:
        raise CompileError(f"syntax error: {error}") from None
    except RecursionError:
        raise CompileError("the query nests too deeply to parse") from None
    except Exception as error:  # sqlglot raises internal errors on some malformed input
        raise CompileError(f"syntax error: {type(error).__name__}: {error}") from None
    if len(statements) != 1:
        raise CompileError(f"expected one SQL statement, got {len(statements)}")
    return statements[0]


def refuse_unknown_args(node: exp.Expression, allowed: set[str], hint: str = "") -> None:
    """Refuse, by name, any clause sqlglot attached to `node` that Quail does not read."""
    for key, value in node.args.items():
        if key in allowed or value is None or value is False or value == []:
            continue
        construct = CLAUSE_NAMES.get(key, key.upper().rstrip("_"))
        target = value if isinstance(value, exp.Expression) else node
        raise unsupported(construct, target, hint)


def safe_sql(node: exp.Expression) -> str:
    """The node as SQL for a message; sqlglot cannot print every tree it parses."""
    try:
        return node.sql()
    except Exception:  # printing is best effort; the message must still be raised
        return type(node).__name__.upper()


def where_of(node: exp.Expression) -> Where:
    """The first line/column sqlglot recorded inside `node`."""
    for item in node.walk():
        meta = item.meta
        if "line" in meta:
            return Where(meta["line"], meta["col"])
    return Where()


def unsupported(construct: str, node: exp.Expression, hint: str = "") -> CompileError:
    where = where_of(node)
    suffix = f"; {hint}" if hint else ""
    return CompileError(f"{construct} is not supported{suffix}", line=where.line, column=where.column)


@dataclass(frozen=True)
class _AiCall:
    kind: AiKind
    spelling: str
    arguments: tuple[exp.Expression, ...]
    node: exp.Expression


def ai_call(node: exp.Expression) -> _AiCall | None:
    """The AI function `node` calls, in either dialect's spelling, or None."""
    if isinstance(node, exp.AIClassify):
        args = [node.this, node.args.get("categories"), node.args.get("config")]
        return _AiCall("classify", "AI_CLASSIFY", tuple(a for a in args if a is not None), node)
    if isinstance(node, exp.Anonymous) and str(node.name).upper() in SNOWFLAKE_NAMES:
        name = str(node.name).upper()
        return _AiCall(SNOWFLAKE_NAMES[name], name, tuple(node.expressions), node)
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and node.this.name.upper() == "AI":
        inner = node.expression
        name = str(inner.name).upper() if isinstance(inner, exp.Anonymous | exp.Func) else ""
        if name not in BIGQUERY_NAMES:
            raise unsupported(f"AI.{name or safe_sql(inner)}", node, "Quail offers AI.IF, AI.CLASSIFY and AI.SCORE")
        arguments = tuple(inner.expressions) if isinstance(inner, exp.Anonymous) else tuple(inner.args.values())
        return _AiCall(BIGQUERY_NAMES[name], f"AI.{name}", arguments, node)
    return None


@dataclass
class _Reader:
    dialect: Dialect
    tables: list[TableSpec] = field(default_factory=list)
    predicates: list[PredicateSpec] = field(default_factory=list)
    equalities: list[EqualitySpec] = field(default_factory=list)
    classifies: list[ClassifySpec] = field(default_factory=list)
    label_filters: list[LabelFilterSpec] = field(default_factory=list)
    scores: list[ScoreSpec] = field(default_factory=list)
    select: list[SelectItem] = field(default_factory=list)
    order: int = 0

    def order_of(self, node: exp.Expression) -> int:
        """Written order: the character offset sqlglot recorded for the call, else arrival order."""
        self.order += 1
        for item in node.walk():
            if "start" in item.meta:
                return int(item.meta["start"]) * 1000 + self.order
        return 10**12 + self.order

    # -- statement shape ----------------------------------------------------------------------

    def read(self, statement: exp.Expression) -> QuerySpec:
        if isinstance(statement, exp.SetOperation):
            raise unsupported(f"set operation {type(statement).__name__.upper()}", statement)
        if not isinstance(statement, exp.Select):
            raise CompileError(f"not a SELECT statement (it starts {statement.sql()[:12]!r}); Quail runs SELECT")
        self._refuse_everywhere(statement)
        self._check_clauses(statement)
        self._read_from(statement)
        self._read_select(statement)
        where = statement.args.get("where")
        if where is not None:
            self._read_condition(where.this, on_of=None)
        return QuerySpec(
            tables=tuple(self.tables), select=tuple(self.select), predicates=tuple(self.predicates),
            equalities=tuple(self.equalities), classifies=tuple(self.classifies),
            label_filters=tuple(self.label_filters), scores=tuple(self.scores), limit=self._limit(statement),
        )

    @staticmethod
    def _refuse_everywhere(statement: exp.Expression) -> None:
        for node in statement.walk():
            if isinstance(node, exp.Window):
                raise unsupported("window function (OVER)", node)
            if isinstance(node, exp.Or):
                raise unsupported("OR", node, "AI predicates combine with AND only")
            if isinstance(node, exp.SetOperation) and node is not statement:
                raise unsupported(f"set operation {type(node).__name__.upper()}", node)

    @staticmethod
    def _check_clauses(select: exp.Expression, allowed: set[str] = SELECT_ARGS) -> None:
        refuse_unknown_args(select, allowed, "relational clauses over results may come later")

    def _limit(self, select: exp.Select) -> int | None:
        limit = select.args.get("limit")
        if limit is None:
            return None
        if isinstance(limit, exp.Fetch):
            raise unsupported("FETCH FIRST ... ROWS", limit, "write LIMIT n")
        value = limit.args.get("expression")
        if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
            raise unsupported("LIMIT with a non-integer value", limit, "write LIMIT n")
        return int(value.this)

    # -- FROM and JOIN ------------------------------------------------------------------------

    def _read_from(self, select: exp.Select) -> None:
        source = select.args.get("from_") or select.args.get("from")
        if source is None:
            raise CompileError("the query has no FROM clause")
        self.tables.append(self._table(source.this, "from"))
        for join in select.args.get("joins") or []:
            self._read_join(join)

    def _table(self, node: exp.Expression, role: Literal["from", "exists", "anti"]) -> TableSpec:
        if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
            raise unsupported(f"{node.key.upper()} in FROM", node, "name a registered table")
        if node.args.get("db") or node.args.get("catalog"):
            raise unsupported(f"qualified table name {safe_sql(node)}", node, "name a registered table")
        refuse_unknown_args(node, TABLE_ARGS | {"db", "catalog"})
        alias = node.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            raise unsupported("column aliases in a table alias", node)
        return TableSpec(node.name, node.alias_or_name, role, where_of(node))

    def _read_join(self, join: exp.Join) -> None:
        side = join.args.get("side")
        if side:
            raise unsupported(f"{side.upper()} OUTER JOIN", join, "outer joins have no AI meaning here")
        if join.args.get("using"):
            raise unsupported("JOIN ... USING", join, "write ON a.x = b.y")
        refuse_unknown_args(join, JOIN_ARGS)
        kind = (join.args.get("kind") or "").upper()
        if kind and kind not in ("CROSS", "INNER"):
            raise unsupported(f"{kind} JOIN", join)
        table = self._table(join.this, "from")
        self.tables.append(table)
        on = join.args.get("on")
        if on is not None:
            self._read_condition(on, on_of=table.alias)

    # -- conditions (WHERE and ON) ------------------------------------------------------------

    def _read_condition(self, node: exp.Expression, on_of: str | None, subquery_of: str | None = None) -> None:
        for conjunct in _conjuncts(node):
            self._read_conjunct(conjunct, on_of, subquery_of)

    def _read_conjunct(self, node: exp.Expression, on_of: str | None, subquery_of: str | None) -> None:
        call = ai_call(node)
        if call is not None:
            self._read_filter_call(call, on_of, subquery_of)
        elif type(node) in COMPARISONS:
            self._read_score_comparison(node, on_of, subquery_of)
        elif isinstance(node, exp.EQ):
            self._read_equality(node, on_of, subquery_of)
        elif isinstance(node, exp.In):
            self._read_label_filter(node, subquery_of)
        elif isinstance(node, exp.Exists) or (isinstance(node, exp.Not) and isinstance(node.this, exp.Exists)):
            self._read_exists(node, subquery_of)
        elif isinstance(node, exp.Not):
            raise unsupported("NOT", node, "only NOT EXISTS (...) is supported")
        elif isinstance(node, exp.Boolean) and node.this is True:
            return
        else:
            raise unsupported(
                f"condition {safe_sql(node)}", node,
                "conditions are AND-ed AI predicates, AI.SCORE comparisons, column equalities and [NOT] EXISTS",
            )

    def _read_filter_call(self, call: _AiCall, on_of: str | None, subquery_of: str | None) -> None:
        if call.kind != "filter":
            raise unsupported(f"{call.spelling} as a condition", call.node,
                              "compare AI.SCORE with a number, or name AI.CLASSIFY in SELECT and filter with IN")
        prompt, options = self._prompt_and_options(call, {"selectivity", "anchor"})
        self.predicates.append(PredicateSpec(
            prompt, self.order_of(call.node), _selectivity(options), _string_option(options, "anchor"),
            None, on_of, subquery_of, where_of(call.node),
        ))

    def _read_score_comparison(self, node: exp.Expression, on_of: str | None, subquery_of: str | None) -> None:
        op = COMPARISONS[type(node)]
        left, right = node.this, node.expression
        call, number = ai_call(left), right
        if call is None:
            call, number, op = ai_call(right), left, FLIPPED[op]
        if call is None or call.kind != "score":
            raise unsupported(f"comparison {safe_sql(node)}", node, "only AI.SCORE(...) can be compared with a number")
        value = _number(number)
        if value is None:
            raise unsupported(f"comparison of AI.SCORE with {safe_sql(number)}", node, "compare with a number literal")
        prompt, options = self._prompt_and_options(call, {"selectivity", "anchor"})
        self.predicates.append(PredicateSpec(
            prompt, self.order_of(call.node), _selectivity(options), _string_option(options, "anchor"),
            ScoreThreshold(op, value), on_of, subquery_of, where_of(call.node),
        ))

    def _read_equality(self, node: exp.EQ, on_of: str | None, subquery_of: str | None) -> None:
        left, right = node.this, node.expression
        if not (_is_plain_column(left) and _is_plain_column(right)):
            raise unsupported(f"condition {safe_sql(node)}", node,
                              "only column = column equalities between two tables are supported")
        self.equalities.append(EqualitySpec(_column(left), _column(right), on_of, where_of(node), subquery_of))

    def _read_label_filter(self, node: exp.In, subquery_of: str | None) -> None:
        target = node.this
        if node.args.get("query") is not None:
            raise unsupported("IN (subquery)", node, "only [NOT] EXISTS subqueries are supported")
        if node.args.get("unnest") is not None or node.args.get("field") is not None:
            raise unsupported("IN UNNEST(...)", node, "write IN ('a', 'b')")
        if subquery_of is not None or not isinstance(target, exp.Column) or target.table:
            raise unsupported(f"IN over {safe_sql(target)}", node, "IN filters an AI.CLASSIFY output by its name")
        values = []
        for value in node.expressions:
            if not (isinstance(value, exp.Literal) and value.is_string):
                raise unsupported(f"IN value {safe_sql(value)}", value, "list label strings")
            values.append(value.this)
        self.label_filters.append(LabelFilterSpec(target.name, tuple(values), where_of(node)))

    def _read_exists(self, node: exp.Expression, subquery_of: str | None) -> None:
        negated = isinstance(node, exp.Not)
        exists = node.this if negated else node
        if subquery_of is not None:
            raise unsupported("nested EXISTS", node)
        query = exists.this
        if not isinstance(query, exp.Select):
            raise unsupported("EXISTS over a non-SELECT", node)
        if query.args.get("joins"):
            raise unsupported("JOIN inside EXISTS", query, "an EXISTS subquery reads one table")
        self._check_clauses(query, SUBQUERY_ARGS)
        source = query.args.get("from_") or query.args.get("from")
        if source is None:
            raise unsupported("EXISTS without FROM", query)
        table = self._table(source.this, "anti" if negated else "exists")
        self.tables.append(table)
        where = query.args.get("where")
        if where is None:
            raise unsupported("EXISTS without an AI predicate", query, "add WHERE AI_FILTER(PROMPT(...))")
        self._read_condition(where.this, on_of=None, subquery_of=table.alias)

    # -- AI calls -----------------------------------------------------------------------------

    def _prompt_and_options(self, call: _AiCall, keys: set[str]) -> tuple[PromptSpec, dict[str, exp.Expression]]:
        if not call.arguments:
            raise unsupported(f"{call.spelling}() without arguments", call.node, "pass PROMPT('…{0}…', column)")
        if len(call.arguments) > 2:
            raise unsupported(f"{call.spelling} with {len(call.arguments)} arguments", call.node,
                              "pass PROMPT(...) and an optional options object")
        prompt = self._prompt(call.arguments[0], call.spelling)
        options = _options(call.arguments[1], keys) if len(call.arguments) == 2 else {}
        return prompt, options

    def _prompt(self, node: exp.Expression, owner: str) -> PromptSpec:
        if not (isinstance(node, exp.Anonymous) and str(node.name).upper() == "PROMPT"):
            raise unsupported(f"{owner} over {safe_sql(node)}", node, f"write {owner}(PROMPT('…{{0}}…', column))")
        arguments = list(node.expressions)
        if not arguments or not (isinstance(arguments[0], exp.Literal) and arguments[0].is_string):
            raise unsupported("PROMPT without a template string", node, "its first argument is a string literal")
        columns = []
        for argument in arguments[1:]:
            if not _is_plain_column(argument):
                raise unsupported(f"PROMPT argument {safe_sql(argument)}", argument, "PROMPT arguments are columns")
            columns.append(_column(argument))
        return PromptSpec(arguments[0].this, tuple(columns), where_of(node))

    def _classify_input(self, node: exp.Expression) -> PromptSpec:
        if _is_plain_column(node):
            return PromptSpec("{0}", (_column(node),), where_of(node))
        return self._prompt(node, "AI.CLASSIFY")

    def _read_classify(self, call: _AiCall, output: str) -> None:
        if len(call.arguments) not in (2, 3):
            raise unsupported(f"{call.spelling} with {len(call.arguments)} arguments", call.node,
                              "pass the input, the labels and optional options")
        prompt = self._classify_input(call.arguments[0])
        labels = _labels(call.arguments[1])
        options = _options(call.arguments[2], {"task_description"}) if len(call.arguments) == 3 else {}
        instructions = _string_option(options, "task_description")
        self.classifies.append(ClassifySpec(prompt, labels, output, self.order_of(call.node), instructions,
                                            where_of(call.node)))

    def _read_score(self, call: _AiCall, output: str) -> None:
        prompt, _ = self._prompt_and_options(call, set())
        self.scores.append(ScoreSpec(prompt, output, self.order_of(call.node), where_of(call.node)))

    # -- SELECT list --------------------------------------------------------------------------

    def _read_select(self, select: exp.Select) -> None:
        for item in select.expressions:
            self.select.append(self._select_item(item))

    def _select_item(self, item: exp.Expression) -> SelectItem:
        if isinstance(item, exp.Star):
            refuse_unknown_args(item, set())
            return SelectItem("star", where=where_of(item))
        if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            refuse_unknown_args(item.this, set())
            return SelectItem("alias_star", alias=item.table, where=where_of(item))
        if _is_plain_column(item):
            return SelectItem("column", column=_column(item), where=where_of(item))
        if isinstance(item, exp.Alias):
            return self._aliased_item(item)
        call = ai_call(item)
        if call is not None and call.kind != "filter":
            raise unsupported(f"{call.spelling} without a name", item, f"write {call.spelling}(...) AS name")
        if call is not None:
            raise unsupported(f"{call.spelling} in SELECT", item, "it filters rows: put it in WHERE or ON")
        if isinstance(item, exp.AggFunc):
            raise unsupported(f"aggregate function {item.key.upper()}", item)
        raise unsupported(f"SELECT expression {safe_sql(item)}", item, "select columns, *, or named AI outputs")

    def _aliased_item(self, item: exp.Alias) -> SelectItem:
        call = ai_call(item.this)
        if call is None or call.kind == "filter":
            raise unsupported(f"SELECT {safe_sql(item)}", item, "AS names AI.CLASSIFY and AI.SCORE outputs only")
        if call.kind == "classify":
            self._read_classify(call, item.alias)
        else:
            self._read_score(call, item.alias)
        return SelectItem("output", output=item.alias, where=where_of(item))


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _is_plain_column(node: exp.Expression) -> bool:
    return isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier) and not node.args.get("db")


def _column(node: exp.Expression) -> ColumnName:
    return ColumnName(node.table or None, node.name, where_of(node))


def _number(node: exp.Expression) -> float | None:
    if isinstance(node, exp.Neg):
        inner = _number(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(node.this)
        except ValueError:
            return None
    return None


def _options(node: exp.Expression, keys: set[str]) -> dict[str, exp.Expression]:
    if not isinstance(node, exp.Struct):
        raise unsupported(f"options {safe_sql(node)}", node, "write {'key': value, ...}")
    options: dict[str, exp.Expression] = {}
    for entry in node.expressions:
        if isinstance(entry, exp.PropertyEQ):
            key, value = entry.this.name, entry.expression
        elif isinstance(entry, exp.Alias):
            key, value = entry.alias, entry.this
        else:
            raise unsupported(f"option {safe_sql(entry)}", entry, "write {'key': value, ...}")
        if key not in keys:
            allowed = ", ".join(sorted(keys)) or "none"
            raise unsupported(f"option {key!r}", entry, f"options here: {allowed}")
        if key in options:
            raise unsupported(f"option {key!r} given twice", entry)
        options[key] = value
    return options


def _selectivity(options: dict[str, exp.Expression]) -> float | None:
    value = options.get("selectivity")
    if value is None:
        return None
    number = _number(value)
    if number is None:
        where = where_of(value)
        raise CompileError(f"selectivity must be a number in [0, 1], got {safe_sql(value)}", line=where.line,
                           column=where.column)
    return number


def _string_option(options: dict[str, exp.Expression], key: str) -> str | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, exp.Literal) and value.is_string:
        return str(value.this)
    if isinstance(value, exp.Column | exp.Identifier):
        return value.name
    raise unsupported(f"{key} {safe_sql(value)}", value, f"{key} is a string")


def _labels(node: exp.Expression) -> tuple[Label, ...]:
    if not isinstance(node, exp.Array):
        raise unsupported(f"labels {safe_sql(node)}", node, "write ['a', 'b'] or [('a', 'description'), ...]")
    labels = []
    for entry in node.expressions:
        if isinstance(entry, exp.Literal) and entry.is_string:
            labels.append(Label(entry.this))
        elif isinstance(entry, exp.Tuple) and len(entry.expressions) == 2 and all(
                isinstance(e, exp.Literal) and e.is_string for e in entry.expressions):
            labels.append(Label(entry.expressions[0].this, entry.expressions[1].this))
        else:
            raise unsupported(f"label {safe_sql(entry)}", entry, "labels are strings or ('label', 'description')")
    return tuple(labels)
