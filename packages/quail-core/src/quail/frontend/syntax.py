"""SQL text → one sqlglot tree, and the AI calls in it, in either dialect's spelling.

Snowflake spells AI functions `AI_FILTER(...)`, `AI_CLASSIFY(...)`, `AI_SCORE(...)`; BigQuery
`AI.IF(...)`, `AI.CLASSIFY(...)`, `AI.SCORE(...)`. Both are normalised to one `AiCall`, so one
reader serves both dialects. Errors carry the line and column sqlglot recorded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.bigquery import BigQuery
from sqlglot.dialects.snowflake import Snowflake
from sqlglot.errors import ParseError, TokenError

from quail.errors import CompileError, GeneralRuleError
from quail.frontend.spec import Where

Dialect = Literal["snowflake", "bigquery"]
AiKind = Literal["filter", "classify", "score", "generate", "embed"]
EMBEDDING = pa.list_(pa.float32())
"""An embedding's column type: DuckDB's FLOAT[] (the encoder computes in float32)."""
OUTPUT_TYPES: dict[str, pa.DataType] = {"filter": pa.bool_(), "score": pa.float64(), "classify": pa.string(),
                                        "generate": pa.string(), "embed": EMBEDDING}
"""The column type of each AI call's output: AI_FILTER a BOOLEAN, AI.SCORE a DOUBLE, AI.CLASSIFY and AI.GENERATE /
AI_COMPLETE a VARCHAR (BigQuery's AI.GENERATE reads it as the `result` of a STRUCT, `calls.call_value`; a structured
generation is a STRUCT, `calls.output_type`), AI.EMBED / AI_EMBED a FLOAT[] (BigQuery's as the `result` of a STRUCT)."""


class QuailBigQuery(BigQuery):
    """BigQuery, except that `IF(...)` stays a plain call so `AI.IF(prompt)` parses, and `AI.GENERATE_BOOL / INT /
    DOUBLE` read their arguments as expressions (sqlglot parses them as `ML.` functions over a model and a table,
    which turns a tuple prompt into a subquery)."""

    class Parser(BigQuery.Parser):
        FUNCTIONS = {  # noqa: RUF012 - sqlglot's own extension point is a class attribute
            **BigQuery.Parser.FUNCTIONS,
            "IF": lambda args: exp.Anonymous(this="IF", expressions=args),
        }
        FUNCTION_PARSERS = {  # noqa: RUF012 - as above
            key: value for key, value in BigQuery.Parser.FUNCTION_PARSERS.items()
            if key not in ("GENERATE_BOOL", "GENERATE_INT", "GENERATE_DOUBLE")
        }


DIALECTS: dict[str, type[sqlglot.Dialect]] = {"snowflake": Snowflake, "bigquery": QuailBigQuery}
SNOWFLAKE_NAMES: dict[str, AiKind] = {"AI_FILTER": "filter", "AI_CLASSIFY": "classify", "AI_SCORE": "score",
                                      "AI_COMPLETE": "generate", "AI_EXTRACT": "generate", "AI_EMBED": "embed"}
BIGQUERY_NAMES: dict[str, AiKind] = {"IF": "filter", "CLASSIFY": "classify", "SCORE": "score", "GENERATE": "generate",
                                     "GENERATE_BOOL": "generate", "GENERATE_INT": "generate",
                                     "GENERATE_DOUBLE": "generate", "EMBED": "embed"}
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
    "ilike": "SELECT * ILIKE", "prior": "PRIOR", "limit": "LIMIT", "where": "WHERE",
}


def parse_one(text: str, dialect: Dialect) -> exp.Expression:
    """The one statement of `text`, or CompileError with sqlglot's description and position."""
    if not isinstance(text, str):
        raise CompileError(f"the query must be a string, got {type(text).__name__}")
    _refuse_other_statements(text)
    try:
        text = _type_literals(text, dialect)
        statements = [s for s in sqlglot.parse(text, read=DIALECTS[dialect]) if s is not None]
    except ParseError as error:
        first = error.errors[0] if error.errors else {}
        description = _readable(str(first.get("description", error)), dialect)
        raise CompileError(f"syntax error: {description}", line=first.get("line"), column=first.get("col")) from None
    except TokenError as error:
        raise CompileError(f"syntax error: {error}") from None
    except RecursionError:
        raise CompileError("the query nests too deeply to parse") from None
    except Exception as error:  # sqlglot raises internal errors on some malformed input
        raise CompileError(f"syntax error: {type(error).__name__}: {error}") from None
    if len(statements) != 1:
        raise CompileError(f"expected one SQL statement, got {len(statements)}")
    return statements[0]


STATEMENTS = frozenset({
    "ALTER", "ANALYZE", "ATTACH", "BEGIN", "CALL", "CHECKPOINT", "COMMENT", "COMMIT", "COPY", "CREATE", "DELETE",
    "DESCRIBE", "DETACH", "DROP", "EXPLAIN", "EXPORT", "GRANT", "IMPORT", "INSERT", "INSTALL", "LOAD", "MERGE",
    "PRAGMA", "REVOKE", "ROLLBACK", "SET", "SHOW", "SUMMARIZE", "TRUNCATE", "UPDATE", "USE", "VACUUM",
})
"""Statements that are not queries: Quail runs one SELECT, and says so by the statement's own name."""
_FIRST_WORD = re.compile(r"\A(?:\s|--[^\n]*\n?|/\*.*?\*/)*([A-Za-z_]+)", re.DOTALL)


def first_word(text: str) -> str:
    """The statement's first word, past whitespace and comments ('' when there is none)."""
    found = _FIRST_WORD.match(text)
    return found.group(1) if found else ""


def _refuse_other_statements(text: str) -> None:
    word = first_word(text).upper()
    if word in STATEMENTS:
        raise CompileError(f"{word} is not a query: Quail runs one SELECT statement (tables come from "
                           "Session.register or --table, never from the statement)", line=1, column=1)


def _type_literals(text: str, dialect: Dialect) -> str:
    """Snowflake's `TYPE OBJECT(name VARCHAR, …)` (AI_COMPLETE's response_format), which sqlglot cannot parse, as the
    string literal 'TYPE OBJECT(…)' that `forms` reads as a schema. Found by tokens, so text inside a string or a
    comment is never touched."""
    if dialect != "snowflake" or "OBJECT" not in text.upper():
        return text
    tokens = DIALECTS[dialect]().tokenize(text)
    spans = []
    for index in range(len(tokens) - 2):
        first, second, third = tokens[index:index + 3]
        if first.text.upper() != "TYPE" or second.text.upper() != "OBJECT" or third.text != "(":
            continue
        depth = 0
        for closing in tokens[index + 2:]:
            depth += (closing.text == "(") - (closing.text == ")")
            if depth == 0:
                spans.append((first.start, closing.end))
                break
    for start, end in reversed(spans):
        text = text[:start] + "'" + text[start:end + 1].replace("'", "''") + "'" + text[end + 1:]
    return text


_MISSING_ARGUMENT = re.compile(r"Required keyword: '(\w+)' missing for <class 'sqlglot\.expressions[\w.]*\.(\w+)'>")


def _readable(description: str, dialect: Dialect) -> str:
    """sqlglot's description in the user's terms: a construct missing an argument names the construct, not a
    class inside sqlglot."""
    found = _MISSING_ARGUMENT.search(description)
    if found is None:
        return description
    keyword, construct = found.groups()
    node = getattr(exp, construct, None)
    names = node.sql_names() if isinstance(node, type) and issubclass(node, exp.Func) else []
    name = names[0] if names else construct.upper()  # AI_AGG, not the class AIAgg
    return (f"{name} is missing its {'first' if keyword == 'this' else keyword} argument as "
            f"{dialect.capitalize()} SQL reads it (is it a function of another SQL dialect?)")


def refuse_unknown_args(node: exp.Expression, allowed: set[str], hint: str = "") -> None:
    """Refuse, by name, any clause sqlglot attached to `node` that the planner of one block does not read (the
    general rule may still answer the statement: DuckDB runs the clause)."""
    for key, value in node.args.items():
        if key in allowed or value is None or value is False or value == []:
            continue
        construct = CLAUSE_NAMES.get(key, key.upper().rstrip("_"))
        target = value if isinstance(value, exp.Expression) else node
        raise beyond_one_block(construct, target, hint)


def safe_sql(node: exp.Expression, dialect: str | None = None) -> str:
    """The node as SQL for a message; sqlglot cannot print every tree it parses."""
    try:
        return node.sql(dialect=DIALECTS.get(dialect or "", dialect))
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


def beyond_one_block(construct: str, node: exp.Expression, hint: str = "") -> GeneralRuleError:
    """`unsupported`, for a shape the general rule may answer (`quail.frontend.lookups`)."""
    where = where_of(node)
    suffix = f"; {hint}" if hint else ""
    return GeneralRuleError(f"{construct} is not supported{suffix}", line=where.line, column=where.column)


def fail_at(message: str, node: exp.Expression) -> CompileError:
    where = where_of(node)
    return CompileError(message, line=where.line, column=where.column)


@dataclass(frozen=True)
class AiCall:
    kind: AiKind
    spelling: str
    arguments: tuple[exp.Expression, ...]
    node: exp.Expression


def ai_call(node: exp.Expression) -> AiCall | None:
    """The AI function `node` calls, in either dialect's spelling, or None."""
    if isinstance(node, exp.AIClassify):
        args = [node.this, node.args.get("categories"), node.args.get("config")]
        return AiCall("classify", "AI_CLASSIFY", tuple(a for a in args if a is not None), node)
    if isinstance(node, exp.AIEmbed) and not isinstance(node.parent, exp.Dot):
        return AiCall("embed", "AI_EMBED", _arguments(node), node)
    if isinstance(node, exp.Anonymous) and str(node.name).upper() in SNOWFLAKE_NAMES:
        name = str(node.name).upper()
        return AiCall(SNOWFLAKE_NAMES[name], name, tuple(node.expressions), node)
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and node.this.name.upper() == "AI":
        inner = node.expression
        name = _function_name(inner)
        if name == "SIMILARITY":
            return None  # two embeddings and a cosine: `embedding_forms` rewrites it before any call is read
        if name not in BIGQUERY_NAMES:
            raise unsupported(f"AI.{name or safe_sql(inner)}", node, _not_offered(f"AI.{name}"))
        arguments = tuple(inner.expressions) if isinstance(inner, exp.Anonymous) else _arguments(inner)
        return AiCall(BIGQUERY_NAMES[name], f"AI.{name}", arguments, node)
    return None


def _arguments(node: exp.Expression) -> tuple[exp.Expression, ...]:
    """The arguments of sqlglot's own node for a warehouse function, in order (some hold them as one list)."""
    found: list[exp.Expression] = []
    for value in node.args.values():
        if isinstance(value, exp.Expression):
            found.append(value)
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, exp.Expression))
    return tuple(found)


def _function_name(node: exp.Expression) -> str:
    """AI.<name>: sqlglot reads some names as its own functions (AI.IF with three arguments is an IF)."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).upper()
    if isinstance(node, exp.Func):  # sqlglot's own node for a warehouse function: AI_GENERATE for AI.GENERATE
        name = node.sql_name().upper()
        return name[3:] if name.startswith("AI_") else name
    return ""


NOT_YET = {
    "generation": ("AI.EXTRACT",
                   "AI_TRANSLATE", "AI_REDACT", "SNOWFLAKE.CORTEX.COMPLETE"),
    "vector search": ("VECTOR_SEARCH",),
}
"""The warehouses' other AI functions: named in the refusal with what they need, never an unknown function."""
WAREHOUSE_FUNCTIONS = {name: kind for kind, names in NOT_YET.items() for name in names}


def _not_offered(name: str) -> str:
    kind = WAREHOUSE_FUNCTIONS.get(name)
    need = {"generation": "it is a form of generation Quail does not offer yet (translated or redacted text)",
            "vector search": "it searches a vector index table, which Quail does not offer yet: write ORDER BY "
                             "AI.SIMILARITY(column, 'query') DESC LIMIT k"}.get(kind or "", "")
    offered = ("Quail offers AI.IF / AI_FILTER, AI.CLASSIFY / AI_CLASSIFY, AI.SCORE / AI_SCORE, text from "
               "AI.GENERATE / AI_COMPLETE and embeddings from AI.EMBED / AI_EMBED and AI.SIMILARITY / AI_SIMILARITY")
    return f"{need}; {offered}" if need else offered


def refuse_other_ai_functions(statement: exp.Expression) -> None:
    """A Snowflake AI function Quail does not offer is refused by its name (otherwise DuckDB would call it an
    unknown function, or the statement one without AI)."""
    for node in statement.find_all(exp.Func):
        if isinstance(node.parent, exp.Dot):
            continue  # BigQuery's AI.<name>: ai_call names it
        name = str(node.name).upper() if isinstance(node, exp.Anonymous) else node.sql_name().upper()
        if name in WAREHOUSE_FUNCTIONS:
            raise unsupported(name, node, _not_offered(name))


def ai_calls(node: exp.Expression) -> list[AiCall]:
    """Every AI call inside `node` (itself included), outermost first."""
    found = []
    for item in node.walk():
        call = ai_call(item)
        if call is not None:
            found.append(call)
    return found


def conjuncts(node: exp.Expression) -> list[exp.Expression]:
    """The AND-ed terms of a condition, parentheses removed."""
    if isinstance(node, exp.Paren):
        return conjuncts(node.this)
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]
