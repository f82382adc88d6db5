"""Chains of 2–4 tables mixing AI joins, column equalities and column predicates, in ON and in WHERE, against
the oracle (DuckDB running the statement with the keyword rule as UDFs) — with an empty answer store, with
the answers of other queries stored, and with every answer of the query itself stored.

The regression that started it: three tables, two AI joins and an equality between the first and the third
(`JOIN c ON c.film_id = f.id AND AI(c, t)`) returned rows that broke the equality, and how many depended on
what the store held. An equality may read an alias its AI predicate does not; the answers, keyed by the
predicate's aliases, must then be joined back through the rows that satisfy it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.relational_oracle import oracle_rows, same_rows

import quail
from quail.testing import ByteTokenizer, KeywordBackend

TABLES = {
    "films": pa.table({
        "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
        "title": ["Quiet Harbor", "Night Songs", "Glass City", "Double Cross", "Grey Days"],
        "body": ["A slow drama about music and grief at the harbor.", "Songs and dancing fill every night scene.",
                 "Heist plot with sharp acting and glass towers.", None, "Grey rain, grief and a quiet ending."],
    }),
    "topics": pa.table({
        "id": pa.array([10, 11, 12, 13], pa.int64()),
        "topic": ["music and songs", "grief", "acting", None],
    }),
    "comments": pa.table({
        "id": pa.array([100, 101, 102, 103, 104, 105, 106, 107], pa.int64()),
        "film_id": pa.array([1, 1, 2, 3, 3, 5, None, 2], pa.int64()),
        "remark": ["The music was lovely.", "Too much grief for me.", "Great songs!", "The acting carried it.",
                   None, "Such grief, such rain.", "Music everywhere.", "Dancing and songs, nothing else."],
    }),
    "critics": pa.table({
        "id": pa.array([200, 201, 202, 203, 204], pa.int64()),
        "film_id": pa.array([1, 2, 3, 3, 5], pa.int64()),
        "note": ["Music-heavy drama.", "A night of songs.", "Acting is sharp.", "", "Grief done well."],
    }),
}
ALIASES = {"films": "f", "topics": "t", "comments": "c", "critics": "k"}
TEXT = {"f": "f.body", "t": "t.topic", "c": "c.remark", "k": "k.note"}
KEYS = {("c", "f"): "c.film_id = f.id", ("k", "f"): "k.film_id = f.id", ("c", "k"): "c.film_id = k.film_id"}
COLUMN = {"f": "f.id <> 2", "t": "t.id >= 11", "c": "c.id < 106", "k": "k.note <> ''"}
FILTER = {"f": "'Is {0} about \"grief\"?'", "c": "'Does {0} mention \"music\"?'"}
ID = {"f": "f.id", "t": "t.id AS tid", "c": "c.id AS cid", "k": "k.id AS kid"}


def _key(a: str, b: str) -> str | None:
    return KEYS.get((a, b)) or KEYS.get((b, a))


def _ai(a: str, b: str, dialect: str) -> str:
    name = "AI_FILTER" if dialect == "snowflake" else "AI.IF"
    return f"{name}(PROMPT('Do {{0}} and {{1}} share a subject?', {TEXT[a]}, {TEXT[b]}))"


@dataclass(frozen=True)
class Chain:
    sql: str
    dialect: str


@st.composite
def chains(draw: st.DrawFn) -> Chain:
    """A left-deep chain: each new table is linked to an earlier one by an AI join or an equality; extra
    equalities to any earlier table, column predicates, single-table AI filters and a second AI predicate over two
    tables an AI join reads come and go; every condition stands in the ON of its table or in WHERE."""
    dialect = draw(st.sampled_from(["snowflake", "bigquery"]))
    count = draw(st.integers(2, 4))
    order = draw(st.permutations(list(ALIASES.values())))[:count]
    on: dict[str, list[str]] = {alias: [] for alias in order}
    where: list[str] = []

    def place(alias: str, condition: str) -> None:
        (on[alias] if alias != order[0] and draw(st.booleans()) else where).append(condition)

    ai_pairs: set[frozenset[str]] = set()
    for index, alias in enumerate(order[1:], start=1):
        earlier = order[:index]
        keyed = [e for e in earlier if _key(alias, e)]
        uses_ai = not keyed or (not ai_pairs and index == count - 1) or draw(st.booleans())
        if uses_ai:
            partner = draw(st.sampled_from(earlier))
            ai_pairs.add(frozenset((alias, partner)))
            place(alias, _ai(alias, partner, dialect))
        for other in keyed:
            if not uses_ai or draw(st.booleans()):
                place(alias, _key(alias, other) or "")
    if draw(st.integers(0, 2)) == 0:  # a second AI predicate over two tables an AI join already reads
        first, second = sorted(draw(st.sampled_from(sorted(sorted(p) for p in ai_pairs))), key=order.index)
        place(second, _ai(second, first, dialect).replace("Do {0} and {1} share a subject?",
                                                          'Do {0} or {1} speak of "grief"?'))
    for alias in order:
        if draw(st.booleans()):
            place(alias, COLUMN[alias])
        if alias in FILTER and draw(st.integers(0, 3)) == 0:
            name = "AI_FILTER" if dialect == "snowflake" else "AI.IF"
            place(alias, f"{name}(PROMPT({FILTER[alias]}, {TEXT[alias]}))")
    tables = {v: k for k, v in ALIASES.items()}
    sql = f"SELECT {', '.join(ID[a] for a in order)} FROM {tables[order[0]]} {order[0]}"
    for alias in order[1:]:
        conditions = on[alias]
        joined = f"JOIN {tables[alias]} {alias} ON {' AND '.join(conditions)}" if conditions else (
            f"CROSS JOIN {tables[alias]} {alias}")
        sql += f" {joined}"
    if where:
        sql += f" WHERE {' AND '.join(where)}"
    return Chain(sql, dialect)


def _session(store: Path) -> quail.Session:
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(tokenizer))
    session = quail.Session(quail.EngineConfig(backend="keyword", cache=str(store)), registry=registry,
                            tokenizer=tokenizer)
    for name, table in TABLES.items():
        session.register(name, table)
    return session


def _check(session: quail.Session, chain: Chain, expected: pa.Table, when: str) -> None:
    got = session.sql(chain.sql, dialect=chain.dialect).run().collect()
    problem = same_rows(got, expected, ordered=False)
    assert problem is None, f"{when}: {chain.sql}\n{problem}"


REGRESSION = Chain(
    "SELECT f.id, t.topic, c.id AS cid FROM films f "
    "JOIN topics t ON AI.IF(PROMPT('Does the review {0} discuss {1}?', f.body, t.topic)) "
    "JOIN comments c ON c.film_id = f.id AND AI.IF(PROMPT('Does the comment {0} discuss {1}?', c.remark, t.topic))",
    "bigquery")


@pytest.mark.parametrize("equality_in", ["on", "where"])
def test_an_equality_to_the_first_table_holds_in_every_row_whatever_the_store_holds(tmp_path, equality_in):
    sql = REGRESSION.sql
    if equality_in == "where":
        sql = sql.replace("ON c.film_id = f.id AND ", "ON ") + " WHERE c.film_id = f.id"
    chain = Chain(sql, "bigquery")
    expected = oracle_rows(chain.sql, chain.dialect, TABLES)
    assert expected.num_rows > 0
    with _session(tmp_path / "answers.sqlite") as session:
        _check(session, chain, expected, "empty store")
        first_join = ("SELECT f.id, t.topic FROM films f JOIN topics t "
                      "ON AI.IF(PROMPT('Does the review {0} discuss {1}?', f.body, t.topic))")
        session.sql(first_join, dialect="bigquery").run()
        _check(session, chain, expected, "after the first join's answers were stored")
        _check(session, chain, expected, "every answer stored")
    with _session(tmp_path / "fresh.sqlite") as session:
        session.sql(first_join, dialect="bigquery").run()
        _check(session, chain, expected, "only the first join's answers stored")


def test_exists_whose_equality_reads_an_outer_table_the_predicate_does_not():
    """A left row (f, t) has a partner c only if c.film_id = f.id: no anchor t may stop at a TRUE for
    another film."""
    chain = Chain(
        "SELECT f.id, t.id AS tid FROM films f JOIN topics t ON AI_FILTER(PROMPT('Do {0} and {1} share a "
        "subject?', f.body, t.topic)) WHERE EXISTS (SELECT 1 FROM comments c WHERE c.film_id = f.id AND "
        "AI_FILTER(PROMPT('Does the comment {0} discuss {1}?', c.remark, t.topic)))", "snowflake")
    expected = oracle_rows(chain.sql, chain.dialect, TABLES)
    with tempfile.TemporaryDirectory() as directory, _session(Path(directory) / "a.sqlite") as session:
        _check(session, chain, expected, "exists")
        _check(session, chain, expected, "exists, stored")
        anti = Chain(chain.sql.replace("WHERE EXISTS", "WHERE NOT EXISTS"), "snowflake")
        _check(session, anti, oracle_rows(anti.sql, anti.dialect, TABLES), "not exists, stored")


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chain=chains(), warm_with=chains())
def test_random_join_chains_match_the_oracle_with_and_without_stored_answers(chain: Chain, warm_with: Chain):
    expected = oracle_rows(chain.sql, chain.dialect, TABLES)
    with tempfile.TemporaryDirectory() as directory, _session(Path(directory) / "a.sqlite") as session:
        _check(session, chain, expected, "empty store")
        _check(session, chain, expected, "every answer stored")
    with tempfile.TemporaryDirectory() as directory, _session(Path(directory) / "a.sqlite") as session:
        session.sql(warm_with.sql, dialect=warm_with.dialect).run()
        _check(session, chain, expected, f"after {warm_with.sql}")


def test_an_equality_with_an_empty_table_plans_and_returns_no_rows(tmp_path):
    """The planner's pair fraction of an equality reads the key columns' value counts: an empty side has none."""
    with _session(tmp_path / "answers.sqlite") as session:
        session.register("nobody", pa.table({"film_id": pa.array([], pa.int64())}))
        sql = ("SELECT f.id FROM films f JOIN nobody n ON n.film_id = f.id JOIN topics t "
               "ON AI_FILTER(PROMPT('Do {0} and {1} share a subject?', f.body, t.topic))")
        assert session.sql(sql).run().collect().num_rows == 0


@pytest.mark.parametrize("sql", [
    "SELECT f.id FROM films f WHERE EXISTS (SELECT 1 FROM comments c JOIN topics t ON AI_FILTER(PROMPT('Do {0} and "
    "{1} share a subject?', c.remark, t.topic)) WHERE c.film_id = f.id)",
    "SELECT f.id, (SELECT COUNT(*) FROM comments c JOIN topics t ON AI_FILTER(PROMPT('Do {0} and {1} share a "
    "subject?', c.remark, t.topic)) WHERE c.film_id = f.id) AS n FROM films f",
])
def test_an_ai_join_inside_a_correlated_subquery_matches_the_oracle(tmp_path, sql):
    """The subquery's AI join is asked of the pairs of its two tables (the general rule); DuckDB runs the correlated
    subquery around the pairs it holds for."""
    with _session(tmp_path / "answers.sqlite") as session:
        _check(session, Chain(sql, "snowflake"), oracle_rows(sql, "snowflake", TABLES), "fresh")


@st.composite
def questions_over_two_tables(draw: st.DrawFn) -> Chain:
    """A TRUE/FALSE question over two tables where no AI join can hold it — under OR or NOT, as a SELECT value or a
    CASE branch, in the ON of a RIGHT, FULL or LEFT join beside a condition on the preserved side — with column
    predicates on either table coming and going."""
    dialect = draw(st.sampled_from(["snowflake", "bigquery"]))
    first, second = draw(st.permutations(list(ALIASES.values())))[:2]
    tables = {v: k for k, v in ALIASES.items()}
    question = _ai(first, second, dialect)
    shape = draw(st.sampled_from(["or", "not", "select", "case", "right", "full", "left"]))
    extra = [COLUMN[a] for a in (first, second) if draw(st.booleans())]
    select = f"{ID[first]}, {ID[second]}"
    source = f"{tables[first]} {first} CROSS JOIN {tables[second]} {second}"
    where = list(extra)
    if shape == "or":
        where.append(f"({question} OR {COLUMN[first]})")
    elif shape == "not":
        where.append(f"NOT {question}")
    elif shape == "select":
        select += f", {question} AS q"
    elif shape == "case":
        select += f", CASE WHEN {question} THEN 'yes' ELSE 'no' END AS q"
    else:
        kind = {"right": "RIGHT", "full": "FULL OUTER", "left": "LEFT"}[shape]
        beside = f" AND {COLUMN[first]}" if shape == "left" else ""
        source = f"{tables[first]} {first} {kind} JOIN {tables[second]} {second} ON {question}{beside}"
        where = []
    sql = f"SELECT {select} FROM {source}" + (f" WHERE {' AND '.join(where)}" if where else "")
    return Chain(sql, dialect)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chain=questions_over_two_tables())
def test_random_questions_over_two_tables_outside_an_ai_join_match_the_oracle(chain: Chain):
    expected = oracle_rows(chain.sql, chain.dialect, TABLES)
    with tempfile.TemporaryDirectory() as directory, _session(Path(directory) / "a.sqlite") as session:
        _check(session, chain, expected, "empty store")
        _check(session, chain, expected, "every answer stored")
