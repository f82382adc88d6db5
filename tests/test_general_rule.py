"""The general rule, end to end against the oracle: statements the planner of one query block does not plan —
AI calls in several blocks (set operations, a CTE over an AI CTE, `IN (SELECT ... AI ...)`), correlated
subqueries over their own table, outer joins with AI conditions, AI calls over expressions or constants, no AI
call at all — answered with each AI call a lookup over the distinct inputs of its table, then the statement on
DuckDB. Every statement runs in both dialects on the keyword backend and must return the oracle's rows (DuckDB
running it with the AI functions as UDFs); the conditions of a call's own block run below it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from relational_oracle import TABLES, oracle_rows, same_rows

import quail
from quail.runtime.lookups import LookupQuery
from quail.testing import ByteTokenizer, KeywordBackend

ACTING = "'Does the review praise the \"acting\"? {0}'"
PLOT = "'Is {0} about the \"plot\"?'"
MUSIC = "'Does {0} mention \"music\"?'"
COFFEE = "'Does {0} mention \"coffee\"?'"
POSITIVE = "'How positive is {0}?'"
SUPERB = "'the acting is superb'"
UNION = {"snowflake": "UNION", "bigquery": "UNION DISTINCT"}
ONE_BLOCK = {"except", "no AI call at all"}
"""Statements the planner of one block plans itself (an AI block inside a set operation; no AI call is the rule's)."""


def ai(template: str, *documents: str, dialect: str = "", d: str = "") -> str:
    name = "AI_FILTER" if (dialect or d) == "snowflake" else "AI.IF"
    return f"{name}(PROMPT({template}, {', '.join(documents)}))"


def score(template: str, document: str, dialect: str) -> str:
    name = "AI_SCORE" if dialect == "snowflake" else "AI.SCORE"
    return f"{name}(PROMPT({template}, {document}))"


def classify(document: str, dialect: str) -> str:
    name = "AI_CLASSIFY" if dialect == "snowflake" else "AI.CLASSIFY"
    return f"{name}({document}, ['acting', 'plot', 'music'])"


def statements(d: str) -> dict[str, str]:
    """Each category of the rule, written in dialect `d`."""
    return {
        "union of two filters": f"SELECT r.id FROM reviews r WHERE {ai(ACTING, 'r.body', dialect=d)} {UNION[d]} "
                                f"SELECT r.id FROM reviews r WHERE {ai(PLOT, 'r.body', dialect=d)}",
        "union all over two tables": f"SELECT r.id AS x FROM reviews r WHERE {ai(MUSIC, 'r.body', dialect=d)} "
                                     f"UNION ALL SELECT e.evidence_id FROM evidence e WHERE "
                                     f"{ai(COFFEE, 'e.passage', dialect=d)}",
        "intersect": f"SELECT r.genre_id FROM reviews r WHERE {ai(ACTING, 'r.body', dialect=d)} INTERSECT "
                     f"{'DISTINCT ' if d == 'bigquery' else ''}SELECT r.genre_id FROM reviews r WHERE "
                     f"{ai(PLOT, 'r.body', dialect=d)}",
        "except": f"SELECT r.id FROM reviews r WHERE r.stars >= 3 EXCEPT {'DISTINCT ' if d == 'bigquery' else ''}"
                  f"SELECT r.id FROM reviews r WHERE {ai(ACTING, 'r.body', dialect=d)}",
        "a CTE over an AI CTE": f"WITH good AS (SELECT r.id, r.body FROM reviews r WHERE "
                                f"{ai(ACTING, 'r.body', dialect=d)}) SELECT g.id FROM good g WHERE "
                                f"{ai(PLOT, 'g.body', dialect=d)}",
        "IN a subquery with its own AI filter": f"SELECT r.id FROM reviews r WHERE {ai(ACTING, 'r.body', dialect=d)}"
                                                f" AND r.genre_id IN (SELECT g.genre_id FROM genres g WHERE "
                                                f"{ai(PLOT, 'g.name', dialect=d)} OR g.genre_id = 1)",
        "correlated EXISTS over the inner table": f"SELECT g.name FROM genres g WHERE EXISTS (SELECT 1 FROM reviews r "
                                                  f"WHERE r.genre_id = g.genre_id AND "
                                                  f"{ai(ACTING, 'r.body', dialect=d)})",
        "correlated NOT EXISTS": f"SELECT g.name FROM genres g WHERE NOT EXISTS (SELECT 1 FROM reviews r WHERE "
                                 f"r.genre_id = g.genre_id AND {ai(PLOT, 'r.body', dialect=d)})",
        "uncorrelated EXISTS": f"SELECT c.claim_id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e WHERE "
                               f"{ai(COFFEE, 'e.passage', dialect=d)})",
        "correlated scalar count": f"SELECT g.genre_id, (SELECT COUNT(*) FROM reviews r WHERE r.genre_id = "
                                   f"g.genre_id AND {ai(ACTING, 'r.body', dialect=d)}) AS n FROM genres g",
        "LEFT JOIN with an AI condition": f"SELECT g.name, r.id FROM genres g LEFT JOIN reviews r ON r.genre_id = "
                                          f"g.genre_id AND {ai(ACTING, 'r.body', dialect=d)}",
        "LEFT JOIN counted per group": f"SELECT g.genre_id, COUNT(r.id) AS n FROM genres g LEFT JOIN reviews r ON "
                                       f"r.genre_id = g.genre_id AND {ai(MUSIC, 'r.body', dialect=d)} GROUP BY "
                                       "g.genre_id",
        "RIGHT JOIN": f"SELECT g.name, r.id FROM reviews r RIGHT JOIN genres g ON r.genre_id = g.genre_id AND "
                      f"{ai(PLOT, 'r.body', dialect=d)}",
        "FULL OUTER JOIN": f"SELECT g.name, r.id FROM reviews r FULL OUTER JOIN genres g ON r.genre_id = "
                           f"g.genre_id AND {ai(ACTING, 'r.body', dialect=d)}",
        "AI over the nullable side of a LEFT JOIN": f"SELECT r.id, a.aspect_id, {score(POSITIVE, 'a.aspect', d)} AS s "
                                                    "FROM reviews r LEFT JOIN aspects a ON r.stars = a.weight",
        "expressions as PROMPT arguments": f"SELECT r.id FROM reviews r WHERE "
                                           f"{ai(ACTING, 'UPPER(COALESCE(r.body, r.title))', dialect=d)}",
        "substring and concatenation": f"SELECT r.id, {ai(PLOT, 'CONCAT(r.title, SUBSTRING(r.body, 1, 30))', d=d)}"
                                       " AS p FROM reviews r",
        "a cast as the document": f"SELECT a.aspect_id, {classify('CAST(a.weight AS STRING)', d)} AS k FROM aspects a",
        "two columns of one table in two calls": f"SELECT r.id FROM reviews r WHERE {ai(ACTING, 'r.body', dialect=d)} "
                                                 f"AND {ai(PLOT, 'r.title', dialect=d)} IS NOT TRUE",
        "a cross product with a filter on one side": f"SELECT r.id, g.genre_id FROM reviews r CROSS JOIN genres g "
                                                     f"WHERE {ai(MUSIC, 'r.body', dialect=d)}",
        "a constant prompted, no FROM": f"SELECT {ai(ACTING, SUPERB, dialect=d)} AS a",
        "no AI call at all": "SELECT r.id, r.stars FROM reviews r WHERE r.stars >= 4",
        "JOIN ... USING": f"SELECT r.id, g.name FROM reviews r JOIN genres g USING (genre_id) WHERE "
                          f"{ai(ACTING, 'r.body', dialect=d)}",
        "VALUES as a joined table": f"SELECT r.id, v.w FROM reviews r JOIN (VALUES (1, 'acting'), (2, 'plot')) AS "
                                    f"v(k, w) ON r.genre_id = v.k WHERE {ai(ACTING, 'r.body', dialect=d)}",
        "an empty result": f"SELECT r.id FROM reviews r WHERE r.stars > 9 AND {ai(PLOT, 'r.body', dialect=d)} "
                           f"{UNION[d]} SELECT r.id FROM reviews r WHERE r.id < 0 AND {ai(ACTING, 'r.body', d=d)}",
    }


CASES = [(d, name, sql) for d in ("snowflake", "bigquery") for name, sql in statements(d).items()]


def keyword_session(store: Path | None = None) -> quail.Session:
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(tokenizer))
    session = quail.Session(quail.EngineConfig(backend="keyword", cache=str(store) if store else "off"),
                            registry=registry, tokenizer=tokenizer)
    for name, table in TABLES.items():
        session.register(name, table)
    return session


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with keyword_session() as opened:
        yield opened


@pytest.mark.parametrize(("dialect", "name", "sql"), CASES, ids=[f"{d}: {n}" for d, n, _ in CASES])
def test_the_general_rule_answers_as_the_oracle_does(session, dialect, name, sql):
    query = session.sql(sql, dialect=dialect)
    problem = same_rows(query.run().collect(), oracle_rows(sql, dialect), ordered=False)
    assert problem is None, f"{name}: {problem}"


@pytest.mark.parametrize("dialect", ["snowflake", "bigquery"])
def test_every_statement_but_those_of_one_ai_block_goes_by_the_rule(session, dialect):
    planned = {name: type(session.sql(sql, dialect=dialect)) for name, sql in statements(dialect).items()}
    by_rule = {name for name, kind in planned.items() if kind is LookupQuery}
    assert by_rule == set(planned) - (ONE_BLOCK - {"no AI call at all"})


def test_stored_answers_never_change_a_result():
    sql = statements("snowflake")["correlated scalar count"]
    expected = oracle_rows(sql, "snowflake")
    with tempfile.TemporaryDirectory() as directory, keyword_session(Path(directory) / "a.sqlite") as session:
        first = session.sql(sql).run()
        again = session.sql(sql).run()
    assert same_rows(first.collect(), expected, ordered=False) is None
    assert same_rows(again.collect(), expected, ordered=False) is None
    assert first.report["fresh_tokens"] > 0 and again.report["fresh_tokens"] == 0


def test_the_conditions_of_a_calls_own_block_run_below_it(session):
    """The model reads only the rows its block's conditions on that table keep; explain() names them."""
    narrow = (f"SELECT r.id FROM reviews r WHERE r.stars >= 4 AND {ai(ACTING, 'r.body', dialect='snowflake')} "
              f"UNION SELECT e.evidence_id FROM evidence e WHERE {ai(COFFEE, 'e.passage', dialect='snowflake')}")
    wide = narrow.replace("r.stars >= 4 AND ", "")
    query = session.sql(narrow)
    assert "conditions applied below it: r.stars >= 4" in query.explain()
    assert query.run().report["fresh_tokens"] < session.sql(wide).run().report["fresh_tokens"]
    assert same_rows(query.run().collect(), oracle_rows(narrow, "snowflake"), ordered=False) is None


def test_a_call_in_an_outer_joins_on_clause_gets_no_condition_pushed_below_it(session):
    """A row such a condition removes could still pick the other side of the outer join: nothing is pushed."""
    sql = (f"SELECT g.name, r.id FROM genres g LEFT JOIN reviews r ON r.genre_id = g.genre_id AND "
           f"{ai(ACTING, 'r.body', dialect='snowflake')} WHERE r.stars IS NULL OR r.stars > 3")
    query = session.sql(sql)
    assert "conditions applied below it: none" in query.explain()
    assert same_rows(query.run().collect(), oracle_rows(sql, "snowflake"), ordered=False) is None


def test_each_distinct_input_is_asked_once(session):
    """Two reviews share a title: the lookup over titles asks the model about each distinct title once."""
    sql = (f"SELECT r.id, {score(POSITIVE, 'r.title', 'snowflake')} AS s FROM reviews r UNION ALL "
           f"SELECT e.evidence_id, {score(POSITIVE, 'e.passage', 'snowflake')} FROM evidence e")
    result = session.sql(sql).run()
    asked = sorted(t.num_rows for name, t in result.answer_tables.items() if name.endswith("/score_v"))
    titles, passages = TABLES["reviews"].column("title").to_pylist(), TABLES["evidence"].column("passage").to_pylist()
    assert len(titles) > len(set(titles))
    assert asked == sorted([len({t for t in titles if t is not None}), len({p for p in passages if p is not None})])


def test_a_refusal_of_the_one_block_planner_still_names_what_neither_can_run(session):
    """An AI predicate over two tables inside OR cannot be a lookup (it reads two tables): the planner's
    refusal is what the user sees."""
    sql = ("SELECT r.id FROM reviews r JOIN aspects a ON r.stars = a.weight WHERE r.id > 1 OR "
           "AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))")
    with pytest.raises(quail.CompileError, match="reads one table"):
        session.sql(sql)


def test_errors_of_the_statement_come_before_any_model_work(session):
    sql = f"SELECT r.id, r.nope FROM reviews r WHERE {ai(ACTING, 'r.body', dialect='snowflake')} UNION SELECT 1, 2"
    with pytest.raises(quail.CompileError, match="nope"):
        session.sql(sql)
