"""Fuzzing the SQL front end: whatever the text, `Session.sql` returns a Query or raises CompileError.

Two generators: token soups (SQL keywords, identifiers of the test tables, punctuation, literals and AI
function names) and mutations of the valid statements of the corpus in test_sql_corpus.py (delete,
duplicate, swap, insert or replace tokens and characters, truncate). Any other exception is a crash.

Inputs that once crashed the front end are kept as explicit `@example(...)` regression cases.
"""

from __future__ import annotations

import os
import re

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.cases import empty_keyword_session
from test_sql_corpus import TABLES, VALID

from quail import CompileError, DocumentProvider, Query, Session
from quail.logical.nodes import Project
from quail.runtime.lookups import LookupQuery

DIALECTS = ("snowflake", "bigquery")
# Derandomized by default so CI is repeatable; QUAIL_FUZZ_RANDOM=1 explores fresh inputs on every run.
DERANDOMIZE = os.environ.get("QUAIL_FUZZ_RANDOM") != "1"
FUZZ = settings(max_examples=300, deadline=None, derandomize=DERANDOMIZE,
                suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def session():
    with empty_keyword_session() as s:
        for name, columns in TABLES.items():
            s.register(name, DocumentProvider.from_table(pa.table(columns), "id"))
        yield s


def assert_compiles_or_refuses(session: Session, text: str, dialect: str) -> None:
    """The property: a Query with a plan, or a CompileError with a message and a sane position."""
    try:
        query = session.sql(text, dialect=dialect)  # type: ignore[arg-type]
    except CompileError as error:
        assert str(error)
        assert (error.line is None) == (error.column is None), "line and column come together"
        if error.line is not None:
            assert error.line >= 1
            assert error.column is not None and error.column >= 0
        return
    if isinstance(query, LookupQuery):  # the general rule: its lookups compiled, the statement bound by DuckDB
        assert query.explain()
        return
    assert isinstance(query, Query)
    assert isinstance(query.logical_plan, Project)
    assert query.explain()


# -- token soups ----------------------------------------------------------------------------------

KEYWORDS = (
    "SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "JOIN", "INNER", "CROSS", "LEFT", "RIGHT", "FULL", "OUTER",
    "NATURAL", "ON", "USING", "AS", "EXISTS", "IN", "IS", "NULL", "TRUE", "FALSE", "LIMIT", "OFFSET", "TOP",
    "WITH", "UNION", "ALL", "INTERSECT", "EXCEPT", "GROUP", "BY", "ORDER", "HAVING", "DISTINCT", "QUALIFY",
    "OVER", "PARTITION", "CASE", "WHEN", "THEN", "ELSE", "END", "BETWEEN", "LIKE", "CAST", "INTERVAL",
    "LATERAL", "UNNEST", "TABLESAMPLE", "PIVOT", "EXCLUDE", "REPLACE", "VALUES", "INSERT", "INTO", "ASC", "DESC",
)
IDENTIFIERS = (
    "reviews", "aspects", "claims", "evidence", "traces", "nope", "r", "a", "c", "e", "t", "x",
    "id", "body", "title", "stars", "aspect", "description", "text", "url", "passage", "source_id", "log",
    "r.id", "r.body", "r.title", "r.stars", "a.aspect", "a.description", "c.text", "c.url", "e.passage",
    "e.source_id", "t.log", "r.*", "a.*", "x.y", "db.reviews", "sentiment", "s", '"reviews"', "`reviews`",
)
AI_NAMES = (
    "AI_FILTER", "AI_CLASSIFY", "AI_SCORE", "AI.IF", "AI.CLASSIFY", "AI.SCORE", "AI.SUMMARIZE", "AI.GENERATE",
    "ai_filter", "ai.if", "AI", "PROMPT", "STRUCT", "ARRAY", "COUNT", "ROW_NUMBER",
)
PUNCTUATION = (
    "(", ")", ",", ".", ";", "[", "]", "{", "}", ":", "=", "<", ">", "<=", ">=", "<>", "!=", "+", "-", "*", "/",
    "||", "::", "=>", "'", '"', "`", "$", "?", "@", "%", "\n", "--", "/*", "*/",
)
STRING_LITERALS = (
    "'{0}'", "'{0} {1}'", "'{0} {1} {2}'", "'{1}'", "'{0} {0}'", "'{}'", "'{'", "'no placeholder'",
    "'selectivity'", "'anchor'", "'task_description'", "'r'", "'a'", "'pos'", "'neg'", "''", "'it''s'",
)
NUMBER_LITERALS = ("0", "1", "0.3", "0.8", "1.5", "-0.1", "1e9", "1e400", ".5", "007", "0x1F", "99999999999999999999")

_SAFE_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",))
_string = st.one_of(
    st.sampled_from(STRING_LITERALS),
    st.text(_SAFE_CHARS, max_size=8).map(lambda s: "'" + s.replace("'", "''") + "'"),
)
_number = st.one_of(
    st.sampled_from(NUMBER_LITERALS),
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
_token = st.one_of(
    st.sampled_from(KEYWORDS), st.sampled_from(IDENTIFIERS), st.sampled_from(AI_NAMES),
    st.sampled_from(PUNCTUATION), _string, _number,
)
_separator = st.sampled_from((" ", " ", " ", "", "\n", "\t"))
PREFIXES = (
    "", "SELECT ", "SELECT r.id FROM reviews r WHERE ", "SELECT * FROM reviews r JOIN aspects a ON ",
    "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT(", "SELECT c.id FROM claims c WHERE EXISTS (SELECT 1 FROM ",
)


@st.composite
def token_soups(draw: st.DrawFn) -> str:
    prefix = draw(st.sampled_from(PREFIXES))
    pieces = draw(st.lists(st.tuples(_token, _separator), min_size=1, max_size=40))
    return prefix + "".join(token + separator for token, separator in pieces)


# Crashes found while fuzzing and probing (sqlglot's own function builders on odd argument lists, and
# error messages that printed trees sqlglot cannot print). Each is one line to reproduce.
_WHERE = "SELECT r.id FROM reviews r WHERE "


def crash(condition: str, dialect: str) -> example:
    """A once-crashing `WHERE <condition>`: it must now compile or raise CompileError."""
    return example(text=_WHERE + condition, dialect=dialect)


@crash("REGEXP_EXTRACT('x')", "bigquery")
@crash("AI_FILTER(PROMPT('{0}', r.body), OBJECT_CONSTRUCT('selectivity'))", "snowflake")
@crash("WEEK()", "bigquery")
@crash("DATETIME_ADD()", "bigquery")
@crash("(" * 1000 + "AI_FILTER(PROMPT('{0}', r.body))" + ")" * 1000, "snowflake")
@crash("AI_FILTER(PROMPT('' => r.body))", "snowflake")
@crash("IDENTIFIER(1, 2)", "snowflake")
@crash("TIMESTAMP()", "snowflake")
@crash("REGEXP_REPLACE(1, 2)", "bigquery")
@crash("AI.FORMAT_DATE('x')", "bigquery")
@crash("AI.CASE(SCORE, 1)", "bigquery")
@example(text="", dialect="snowflake")
@example(text="SELECT", dialect="bigquery")
@example(text="SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}', r.body)) 'unterminated", dialect="snowflake")
@example(text=_WHERE + "AI.SCORE(PROMPT('{0}', r.body)) >= 1e400", dialect="bigquery")
@example(text=_WHERE + "AI_FILTER(PROMPT('{0}', r.body)) LIMIT 99999999999999999999", dialect="snowflake")
@given(text=token_soups(), dialect=st.sampled_from(DIALECTS))
@FUZZ
def test_token_soup_compiles_or_raises_compile_error(session, text: str, dialect: str):
    assert_compiles_or_refuses(session, text, dialect)


# -- mutations of the valid corpus ----------------------------------------------------------------

TOKEN = re.compile(r"'(?:[^']|'')*'|[A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*|\.\*)*|\d+(?:\.\d+)?|\S")
MUTATIONS = ("delete_token", "duplicate_token", "swap_tokens", "insert_token", "replace_token", "delete_char",
             "insert_char", "duplicate_span", "truncate")
_VOCABULARY = st.one_of(
    st.sampled_from(KEYWORDS), st.sampled_from(IDENTIFIERS), st.sampled_from(AI_NAMES),
    st.sampled_from(PUNCTUATION), st.sampled_from(STRING_LITERALS), st.sampled_from(NUMBER_LITERALS),
)


def _mutate(draw: st.DrawFn, text: str, mutation: str) -> str:
    spans = [m.span() for m in TOKEN.finditer(text)]
    if not spans or not text:
        return draw(_VOCABULARY)
    index = st.integers(min_value=0, max_value=len(spans) - 1)
    if mutation == "delete_token":
        start, end = spans[draw(index)]
        return text[:start] + text[end:]
    if mutation == "duplicate_token":
        start, end = spans[draw(index)]
        return text[:end] + " " + text[start:end] + text[end:]
    if mutation == "swap_tokens":
        first, second = sorted((spans[draw(index)], spans[draw(index)]))
        if first == second:
            return text
        return (text[: first[0]] + text[second[0]: second[1]] + text[first[1]: second[0]]
                + text[first[0]: first[1]] + text[second[1]:])
    if mutation == "insert_token":
        start, _ = spans[draw(index)]
        return text[:start] + draw(_VOCABULARY) + " " + text[start:]
    if mutation == "replace_token":
        start, end = spans[draw(index)]
        return text[:start] + draw(_VOCABULARY) + text[end:]
    position = st.integers(min_value=0, max_value=len(text) - 1)
    if mutation == "delete_char":
        at = draw(position)
        return text[:at] + text[at + 1:]
    if mutation == "insert_char":
        at = draw(position)
        return text[:at] + draw(st.one_of(st.sampled_from("(),.;'\"[]{}=<>*-\n"), _SAFE_CHARS)) + text[at:]
    if mutation == "duplicate_span":
        start = draw(position)
        end = draw(st.integers(min_value=start, max_value=len(text)))
        return text[:end] + text[start:end] + text[end:]
    return text[: draw(position)]


@st.composite
def mutated_corpus_queries(draw: st.DrawFn) -> tuple[str, str]:
    case = draw(st.sampled_from(VALID))
    text = case.sql
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=4)):
        text = _mutate(draw, text, mutation)
    dialect = draw(st.sampled_from((case.dialect, *DIALECTS)))
    return text, dialect


@example(query=(_WHERE + "AI_FILTER(PROMPT('{0}', r.body)) AND AI_FILTER(PROMPT('{0}', r.body))", "snowflake"))
@example(query=("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}', r.body), {'selectivity': 0.3, "
          "'selectivity': 0.3})", "snowflake"))
@example(query=("SELECT r.id, a.id FROM reviews r, aspects a WHERE AI.IF(PROMPT('{0} {1}', r.body, a.aspect))",
          "snowflake"))
@given(query=mutated_corpus_queries())
@FUZZ
def test_mutated_corpus_query_compiles_or_raises_compile_error(session, query: tuple[str, str]):
    text, dialect = query
    assert_compiles_or_refuses(session, text, dialect)


@given(text=st.text(_SAFE_CHARS, max_size=200), dialect=st.sampled_from(DIALECTS))
@settings(FUZZ, max_examples=150)
def test_arbitrary_text_compiles_or_raises_compile_error(session, text: str, dialect: str):
    assert_compiles_or_refuses(session, text, dialect)


def test_every_valid_corpus_query_still_compiles_before_mutation(session):
    """The mutation fuzzer starts from queries that compile: a broken seed would fuzz nothing useful."""
    for case in VALID:
        assert isinstance(session.sql(case.sql, dialect=case.dialect), Query), case.id
