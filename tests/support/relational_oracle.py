"""An independent oracle for SQL around AI functions: DuckDB itself, running the user's statement.

The oracle knows nothing of Quail's planning: it rewrites each AI call of the statement into a DuckDB
Python UDF that applies the keyword rule of `quail.testing.rules` to the call's documents, row by row
(NULL in, NULL out), transpiles the statement to DuckDB with sqlglot and runs it over the raw tables.
Quail must return the same rows: it pushes column predicates below the model, plans AI predicates as
filters and joins, computes AI output columns once per document and runs the rest on DuckDB — none of
which may change the answer.

The tables hold NULL texts, empty strings, NULL numbers, repeated titles (ties) and ids that are not
row positions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

import quail
from quail.frontend.syntax import DIALECTS
from quail.testing import ByteTokenizer, KeywordBackend
from quail.testing.rules import classify_margins, predicate_margin

REVIEWS = pa.table({
    "id": pa.array([201, 203, 205, 207, 209, 211, 213, 215, 217, 219, 221, 223, 225, 227], pa.int64()),
    "title": ["Quiet Harbor", "Night Songs", "Lost Summer", "Glass City", "Double Cross", "Grey Days",
              "Paper Crowns", "Drumline", "Starfall", "Last Letter", "Noise", "The Heist", "Quiet Harbor",
              "Cold Case"],
    "body": [
        "Brilliant acting from the whole cast, though the plot drags in the middle.",
        "The soundtrack is gorgeous and the music carries every scene.",
        "Boring plot, wooden dialogue, and an ending nobody asked for.",
        "I loved the visual effects; the acting felt flat.",
        "Pacing is tight and the plot twists land perfectly.",
        None,
        "The dialogue sparkles and the acting is superb, a must see.",
        "Music cues were overbearing and the pacing dragged.",
        "",
        "The ending made me cry; superb acting and a lovely soundtrack.",
        "Too long, too loud, too dull.",
        "Clever plot twists and sharp acting throughout.",
        "A remake with weaker acting but better music.",
        "Weak acting and a predictable plot.",
    ],
    "stars": pa.array([4, 5, 1, 3, 5, 2, 5, None, 3, 5, 1, 4, 3, 2], pa.int64()),
    "genre_id": pa.array([1, 2, 1, 3, 3, 1, 2, 2, 3, 1, None, 3, 1, 3], pa.int64()),
    "year": pa.array([2019, 2021, 2018, 2021, 2020, 2019, None, 2022, 2020, 2021, 2018, 2022, 2023, 2020],
                     pa.int64()),
})

ASPECTS = pa.table({
    "aspect_id": pa.array([11, 14, 17, 20, 23, 26], pa.int64()),
    "aspect": ["acting", "plot twists", "soundtrack music", "pacing", None, "ending"],
    "weight": pa.array([3, 4, 2, 1, 5, 2], pa.int64()),
})

GENRES = pa.table({
    "genre_id": pa.array([1, 2, 3, 4], pa.int64()),
    "name": ["drama", "musical", "thriller", "western"],
})

CLAIMS = pa.table({
    "claim_id": pa.array([301, 303, 305, 307, 309], pa.int64()),
    "text": ["Coffee improves memory in older adults.", "Regular exercise lowers blood pressure.",
             "Electric cars produce zero emissions.", None, "Chocolate cures colds."],
    "url": ["health/coffee", "health/exercise", "energy/ev", "health/sleep", "health/chocolate"],
})

EVIDENCE = pa.table({
    "evidence_id": pa.array([401, 402, 403, 404, 405, 406], pa.int64()),
    "source": ["health/coffee", "health/coffee", "health/exercise", "energy/ev", "health/sleep", "misc/none"],
    "passage": ["A trial found coffee improves memory in adults.", "Coffee dehydrates in large doses.",
                "Exercise lowers blood pressure in most patients.", "Electric cars still produce emissions.",
                "Sleep quality improves with exercise.", None],
})

TABLES: dict[str, pa.Table] = {"reviews": REVIEWS, "aspects": ASPECTS, "genres": GENRES, "claims": CLAIMS,
                               "evidence": EVIDENCE}


def keyword_session(store: Path | None = None, tables: Mapping[str, pa.Table] | None = None,
                    aliases: Mapping[str, str] | None = None) -> quail.Session:
    """A session on the keyword test backend over `tables` (these TABLES when none), its answer store at `store`
    (off when None), with the model `aliases` given: what the oracle's rules are compared with."""
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(tokenizer))
    config = quail.EngineConfig(backend="keyword", cache=str(store) if store else "off", model_aliases=aliases or {})
    session = quail.Session(config, registry=registry, tokenizer=tokenizer)
    for name, table in (TABLES if tables is None else tables).items():
        session.register(name, table)
    return session

# -- the UDFs: the keyword rule, row by row -------------------------------------------------------


def _holds(template: str, documents: list[str | None]) -> bool | None:
    if any(d is None for d in documents):
        return None
    return predicate_margin(template, list(documents)) > 0


def _score(template: str, documents: list[str | None]) -> float | None:
    if any(d is None for d in documents):
        return None
    margin = predicate_margin(template, list(documents))
    if margin >= 0:
        return 1.0 / (1.0 + math.exp(-margin))
    e = math.exp(margin)
    return e / (1.0 + e)


def _classify(document: str | None, labels: list[str]) -> str | None:
    if document is None:
        return None
    margins = classify_margins(labels, document)
    best = 0
    for index, value in enumerate(margins):
        if value > margins[best]:
            best = index
    return labels[best]


def _register_udfs(connection: duckdb.DuckDBPyConnection) -> None:
    text, texts = duckdb.sqltype("VARCHAR"), duckdb.list_type(duckdb.sqltype("VARCHAR"))
    # SPECIAL: the UDFs see a NULL document inside the list and answer NULL themselves
    special = {"null_handling": "special"}
    connection.create_function("oracle_if", _holds, [text, texts], duckdb.sqltype("BOOLEAN"), **special)
    connection.create_function("oracle_score", _score, [text, texts], duckdb.sqltype("DOUBLE"), **special)
    connection.create_function("oracle_classify", _classify, [text, texts], text, **special)


# -- the statement, with AI calls as UDF calls ------------------------------------------------------

SNOWFLAKE = {"AI_FILTER": "if", "AI_SCORE": "score", "AI_CLASSIFY": "classify"}
BIGQUERY = {"IF": "if", "SCORE": "score", "CLASSIFY": "classify"}


def _call(node: exp.Expression) -> tuple[str, list[exp.Expression]] | None:
    if isinstance(node, exp.AIClassify):
        return "classify", [node.this, node.args["categories"]]
    if isinstance(node, exp.Anonymous) and node.name.upper() in SNOWFLAKE:
        return SNOWFLAKE[node.name.upper()], _ordered(SNOWFLAKE[node.name.upper()], list(node.expressions))
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and node.this.name.upper() == "AI":
        inner = node.expression
        if isinstance(inner, exp.Anonymous) and inner.name.upper() in BIGQUERY:
            return BIGQUERY[inner.name.upper()], _ordered(BIGQUERY[inner.name.upper()], list(inner.expressions))
        if isinstance(inner, exp.If):  # sqlglot reads AI.IF with two or three arguments as IF
            arguments = [inner.this, inner.args.get("true"), inner.args.get("false")]
            return "if", _ordered("if", [a for a in arguments if a is not None])
    return None


def _ordered(kind: str, arguments: list[exp.Expression]) -> list[exp.Expression]:
    """Named arguments in their places (input / prompt first, categories second), the ignored ones dropped, and
    Snowflake's error-details flag of AI_FILTER dropped."""
    named = {a.this.name.lower(): a.expression for a in arguments if isinstance(a, exp.Kwarg)}
    positional = [a for a in arguments if not isinstance(a, exp.Kwarg)]
    if "input" in named or "prompt" in named:
        positional.insert(0, named.get("input", named.get("prompt")))
    if "categories" in named:
        positional.insert(1, named["categories"])
    if kind == "if" and len(positional) == 2 and isinstance(positional[1], exp.Boolean):
        positional.pop()
    return positional


def _pieces(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Tuple | exp.Concat) or (isinstance(node, exp.Anonymous) and node.name.upper() == "CONCAT"):
        return [p for item in node.expressions for p in _pieces(item)]
    if isinstance(node, exp.DPipe):
        return _pieces(node.this) + _pieces(node.expression)
    if isinstance(node, exp.Paren):
        return _pieces(node.this)
    return [node]


def _template_and_documents(first: exp.Expression) -> tuple[exp.Expression, list[exp.Expression]]:
    """A prompt written as PROMPT(...), a tuple, a concatenation, a string or one expression: its template (the
    literal parts, a placeholder for each other part) and its documents."""
    if isinstance(first, exp.Anonymous) and first.name.upper() == "PROMPT":
        template, *documents = first.expressions
        return template, documents
    template, documents = "", []
    for piece in _pieces(first):
        if isinstance(piece, exp.Literal) and piece.is_string:
            template += piece.this
        else:
            template += "{" + str(len(documents)) + "}"
            documents.append(piece)
    if not documents:
        return exp.Literal.string("{0}"), [exp.Literal.string(template)]
    return exp.Literal.string(template), documents


def _label(entry: exp.Expression) -> exp.Expression:
    """A label as written: 'a', ('a', 'description'), {'label': 'a', ...} or STRUCT('a' AS label, ...)."""
    if isinstance(entry, exp.Tuple):
        return entry.expressions[0]
    if isinstance(entry, exp.Struct):
        for item in entry.expressions:
            key = item.this.name if isinstance(item, exp.PropertyEQ) else item.alias
            if key.lower() == "label":
                return item.expression if isinstance(item, exp.PropertyEQ) else item.this
    return entry


def _udf(node: exp.Expression) -> exp.Expression:
    found = _call(node)
    if found is None:
        return node
    kind, arguments = found
    first = arguments[0]
    if kind == "classify":
        documents = [first] if isinstance(first, exp.Column) else _template_and_documents(first)[1]
        labels = [_label(e) for e in arguments[1].expressions]
        return exp.Anonymous(this="oracle_classify", expressions=[documents[0].copy(),
                                                                  exp.Array(expressions=[x.copy() for x in labels])])
    template, documents = _template_and_documents(first)
    return exp.Anonymous(this=f"oracle_{kind}", expressions=[template.copy(),
                                                              exp.Array(expressions=[d.copy() for d in documents])])


def oracle_sql(sql: str, dialect: str) -> str:
    tree = sqlglot.parse_one(sql, read=DIALECTS[dialect])
    return tree.transform(_udf).sql(dialect="duckdb")


def oracle_rows(sql: str, dialect: str, tables: Mapping[str, pa.Table] = TABLES) -> pa.Table:
    connection = duckdb.connect()
    try:
        _register_udfs(connection)
        for name, table in tables.items():
            connection.register(name, table)
        return connection.sql(oracle_sql(sql, dialect)).to_arrow_table()
    finally:
        connection.close()


# -- comparing ------------------------------------------------------------------------------------


def _value(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 9)
    if isinstance(value, list):
        return tuple(_value(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _value(v)) for k, v in value.items()))
    return value


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [tuple(_value(column[i]) for column in columns) for i in range(table.num_rows)]


def same_rows(got: pa.Table, expected: pa.Table, ordered: bool) -> str | None:
    """None when the two results hold the same rows (in the same order when `ordered`), else why not."""
    if got.num_columns != expected.num_columns:
        return f"{got.num_columns} columns {got.column_names}, the oracle has {expected.num_columns}"
    mine, theirs = rows_of(got), rows_of(expected)
    if ordered:
        return None if mine == theirs else f"rows in order differ:\n quail  {mine}\n oracle {theirs}"
    if Counter(mine) == Counter(theirs):
        return None
    return f"rows differ:\n quail  {sorted(mine, key=repr)}\n oracle {sorted(theirs, key=repr)}"


def oracle_of(sql: str, dialect: str, tables: Mapping[str, pa.Table] = TABLES) -> Sequence[tuple[Any, ...]]:
    return rows_of(oracle_rows(sql, dialect, tables))
