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
from support.relational_oracle import TABLES, keyword_session, oracle_rows, same_rows

import quail
from quail.runtime.lookups import LookupQuery

ACTING = "'Does the review praise the \"acting\"? {0}'"
PLOT = "'Is {0} about the \"plot\"?'"
MUSIC = "'Does {0} mention \"music\"?'"
COFFEE = "'Does {0} mention \"coffee\"?'"
POSITIVE = "'How positive is {0}?'"
SUPERB = "'the acting is superb'"
UNION = {"snowflake": "UNION", "bigquery": "UNION DISTINCT"}
SEPARATED = "CONCAT(COALESCE(r.title, ''), ' / ', r.body)"
SHARED = "'Do {0} and {1} share a word?'"
WITH = "'Does {0} with {1} mention \"acting\"?'"
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


def more_statements(d: str) -> dict[str, str]:
    """The same rule under more of the SQL analysts write around it: aggregates, windows, ordering, NULLs."""
    acting, plot, music = (ai(t, "r.body", dialect=d) for t in (ACTING, PLOT, MUSIC))
    coffee = ai(COFFEE, "e.passage", dialect=d)
    union = UNION[d]
    return {
        "union then ORDER BY and LIMIT": f"SELECT r.id FROM reviews r WHERE {acting} {union} SELECT r.id FROM "
                                         f"reviews r WHERE {plot} ORDER BY 1 LIMIT 3",
        "union all counted": f"SELECT COUNT(*) AS n FROM (SELECT r.id FROM reviews r WHERE {acting} UNION ALL "
                             f"SELECT e.evidence_id FROM evidence e WHERE {coffee}) u",
        "CTEs chained through two AI steps": f"WITH a AS (SELECT r.id, r.body, r.stars FROM reviews r WHERE "
                                             f"{acting}), b AS (SELECT a.id, a.stars FROM a WHERE "
                                             f"{ai(PLOT, 'a.body', d=d)}) SELECT b.id FROM b WHERE b.stars >= 3",
        "NOT IN a subquery with AI": f"SELECT g.genre_id FROM genres g WHERE g.genre_id NOT IN (SELECT r.genre_id "
                                     f"FROM reviews r WHERE {acting} AND r.genre_id IS NOT NULL)",
        "EXISTS with a NULL-safe condition": f"SELECT g.name FROM genres g WHERE EXISTS (SELECT 1 FROM reviews r "
                                             f"WHERE r.genre_id = g.genre_id AND r.stars IS NOT NULL AND {music})",
        "correlated count with a HAVING": f"SELECT g.genre_id FROM genres g WHERE (SELECT COUNT(*) FROM reviews r "
                                          f"WHERE r.genre_id = g.genre_id AND {acting}) >= 1",
        "correlated max of a score": f"SELECT g.genre_id, (SELECT MAX({score(POSITIVE, 'r.body', d)}) FROM reviews r "
                                     "WHERE r.genre_id = g.genre_id) AS best FROM genres g",
        "LEFT JOIN with COALESCE": f"SELECT g.name, COALESCE(CAST(r.id AS STRING), 'none') AS review FROM genres g "
                                  f"LEFT JOIN reviews r ON r.genre_id = g.genre_id AND {plot}",
        "LEFT JOIN filtered on the right afterwards": f"SELECT g.name, r.id FROM genres g LEFT JOIN reviews r ON "
                                                      f"r.genre_id = g.genre_id AND {acting} WHERE r.id IS NULL",
        "FULL JOIN with AI on both sides' tables": f"SELECT g.name, r.id FROM reviews r FULL OUTER JOIN genres g ON "
                                                  f"r.genre_id = g.genre_id AND {music} AND "
                                                  f"{ai(PLOT, 'g.name', d=d)} IS NOT TRUE",
        "a window over an AI value in a union branch": f"SELECT r.id, SUM(CASE WHEN {acting} THEN 1 ELSE 0 END) "
                                                       "OVER (ORDER BY r.id) AS running FROM reviews r UNION ALL "
                                                       f"SELECT e.evidence_id, 0 FROM evidence e WHERE {coffee}",
        "GROUP BY a classification in a CTE read twice": f"WITH k AS (SELECT r.id, {classify('r.body', d)} AS topic "
                                                         f"FROM reviews r) SELECT k.topic, COUNT(*) AS n FROM k "
                                                         f"WHERE k.id IN (SELECT r.id FROM reviews r WHERE {acting}) "
                                                         "GROUP BY k.topic",
        "DISTINCT over a union": f"SELECT DISTINCT x FROM (SELECT r.genre_id AS x FROM reviews r WHERE {acting} "
                                 f"UNION ALL SELECT r.genre_id FROM reviews r WHERE {plot}) u",
        "an AI value compared in a join condition": f"SELECT r.id, a.aspect_id FROM reviews r JOIN aspects a ON "
                                                    f"r.stars = a.weight LEFT JOIN genres g ON g.genre_id = "
                                                    f"r.genre_id AND {ai(MUSIC, 'g.name', d=d)}",
        "a score threshold in a correlated subquery": f"SELECT g.genre_id FROM genres g WHERE EXISTS (SELECT 1 FROM "
                                                      f"reviews r WHERE r.genre_id = g.genre_id AND "
                                                      f"{score(POSITIVE, 'r.body', d)} > 0.5)",
        "an expression of two columns": f"SELECT r.id FROM reviews r WHERE "
                                        f"{ai(ACTING, SEPARATED, d=d)}",
        "a NULL-only input": f"SELECT r.id, {ai(ACTING, 'CAST(NULL AS STRING)', d=d)} AS a FROM reviews r "
                            "WHERE r.id < 205",
        "an empty table side": f"SELECT r.id FROM reviews r WHERE r.id < 0 AND {acting} {union} SELECT e.evidence_id "
                               f"FROM evidence e WHERE e.evidence_id < 0 AND {coffee}",
        "IN a list and an AI subquery": f"SELECT r.id FROM reviews r WHERE r.genre_id IN (1, 2) OR r.id IN "
                                        f"(SELECT e.evidence_id - 196 FROM evidence e WHERE {coffee})",
        "a classification over an expression": f"SELECT r.id, {classify('LOWER(r.title)', d)} AS k FROM reviews r",
        "two lookups over one table in one block": f"SELECT r.id, {acting} AS a, {ai(PLOT, 'r.title', d=d)} AS t "
                                                   "FROM reviews r WHERE r.stars >= 2",
    }


def further_statements(d: str) -> dict[str, str]:
    """Deeper nesting and more set operations."""
    acting, plot, music = (ai(t, "r.body", dialect=d) for t in (ACTING, PLOT, MUSIC))
    coffee = ai(COFFEE, "e.passage", dialect=d)
    union, distinct = UNION[d], "DISTINCT " if d == "bigquery" else ""
    return {
        "a union of three": f"SELECT r.id FROM reviews r WHERE {acting} {union} SELECT r.id FROM reviews r WHERE "
                            f"{plot} {union} SELECT r.id FROM reviews r WHERE {music}",
        "an intersect of three": f"SELECT r.genre_id FROM reviews r WHERE {acting} INTERSECT {distinct}SELECT "
                                 f"r.genre_id FROM reviews r WHERE r.stars >= 3 INTERSECT {distinct}SELECT r.genre_id "
                                 f"FROM reviews r WHERE {plot}",
        "a correlated subquery two levels deep": f"SELECT g.name FROM genres g WHERE EXISTS (SELECT 1 FROM reviews r "
                                                 f"WHERE r.genre_id = g.genre_id AND EXISTS (SELECT 1 FROM aspects a "
                                                 f"WHERE a.weight = r.stars AND {ai(PLOT, 'a.aspect', d=d)}))",
        "a scalar subquery in WHERE": f"SELECT r.id FROM reviews r WHERE r.stars > (SELECT COUNT(*) FROM evidence e "
                                      f"WHERE {coffee})",
        "a CTE with AI read twice": f"WITH hits AS (SELECT r.id, r.genre_id FROM reviews r WHERE {acting}) SELECT "
                                    "h1.id FROM hits h1 JOIN hits h2 ON h1.genre_id = h2.genre_id AND h1.id < h2.id",
        "ORDER BY a score over a union, LIMIT": f"SELECT u.id, u.s FROM (SELECT r.id, {score(POSITIVE, 'r.body', d)} "
                                                f"AS s FROM reviews r UNION ALL SELECT e.evidence_id, "
                                                f"{score(POSITIVE, 'e.passage', d)} FROM evidence e) u WHERE u.s IS "
                                                "NOT NULL ORDER BY u.s DESC, u.id LIMIT 4",
        "HAVING over a union's AI counts": f"SELECT u.g, COUNT(*) AS n FROM (SELECT r.genre_id AS g FROM reviews r "
                                           f"WHERE {acting} UNION ALL SELECT r.genre_id FROM reviews r WHERE {plot}) u "
                                           "GROUP BY u.g HAVING COUNT(*) >= 2",
        "CASE over an outer join's AI": f"SELECT g.name, CASE WHEN {music} THEN 'music' WHEN r.id IS NULL THEN 'none' "
                                        "ELSE 'other' END AS kind FROM genres g LEFT JOIN reviews r ON r.genre_id = "
                                        "g.genre_id",
        "a self-join filtered on one side": f"SELECT r.id, q.id AS other FROM reviews r JOIN reviews q ON r.genre_id "
                                            f"= q.genre_id AND r.id < q.id WHERE {ai(ACTING, 'q.body', d=d)}",
        "an AI condition on an aggregate's input in a subquery": f"SELECT g.genre_id FROM genres g WHERE g.genre_id "
                                                                 f"IN (SELECT r.genre_id FROM reviews r GROUP BY "
                                                                 f"r.genre_id HAVING SUM(CASE WHEN {acting} THEN 1 "
                                                                 "ELSE 0 END) > 0)",
        "an AI call in a QUALIFY of a union branch": f"SELECT r.id FROM reviews r QUALIFY ROW_NUMBER() OVER (PARTITION "
                                                     f"BY {acting} ORDER BY r.id) = 1 {union} SELECT e.evidence_id "
                                                     f"FROM evidence e WHERE {coffee}",
        "claims with and without evidence": f"SELECT c.claim_id, (SELECT COUNT(*) FROM evidence e WHERE e.source = "
                                            f"c.url AND {coffee}) AS n FROM claims c",
        "an AI filter over a derived table without AI": f"SELECT d.id FROM (SELECT r.id, UPPER(r.body) AS b FROM "
                                                        f"reviews r) d WHERE {ai(ACTING, 'd.b', d=d)} {union} "
                                                        "SELECT 0",
        "an EXCEPT of two tables' ids": f"SELECT r.id - 200 AS x FROM reviews r WHERE {acting} EXCEPT {distinct}"
                                        f"SELECT e.evidence_id - 400 FROM evidence e WHERE {coffee}",
        "a correlated classification": f"SELECT g.name, (SELECT MIN({classify('r.body', d)}) FROM reviews r WHERE "
                                       "r.genre_id = g.genre_id) AS first_topic FROM genres g",
        "nullable side counted by AI": f"SELECT g.genre_id, COUNT(CASE WHEN {plot} THEN 1 END) AS n FROM genres g "
                                       "LEFT JOIN reviews r ON r.genre_id = g.genre_id GROUP BY g.genre_id",
        "an AI filter under NOT over a union": f"SELECT r.id FROM reviews r WHERE NOT ({acting}) {union} SELECT "
                                               f"e.evidence_id FROM evidence e WHERE NOT ({coffee})",
        "a constant and a column prompted together": f"SELECT r.id, {ai(ACTING, SUPERB, dialect=d)} AS c, {acting} AS "
                                                     "a FROM reviews r WHERE r.id <= 205",
        "AI in an ON of a join inside a CTE, read by a union": f"WITH p AS (SELECT g.name, r.id FROM genres g RIGHT "
                                                               f"JOIN reviews r ON r.genre_id = g.genre_id AND {plot}) "
                                                               f"SELECT p.id FROM p WHERE p.name IS NULL {union} "
                                                               "SELECT 1",
        "every review with its aspect count by AI": f"SELECT r.id, (SELECT COUNT(*) FROM aspects a WHERE a.weight = "
                                                    f"r.stars AND {ai(PLOT, 'a.aspect', d=d)}) AS n FROM reviews r",
        "an AI join in a CTE, asked again after": f"WITH j AS (SELECT r.id, r.body, a.aspect FROM reviews r JOIN "
                                                  f"aspects a ON {ai(SHARED, 'r.body', 'a.aspect', d=d)}) SELECT "
                                                  f"j.id, j.aspect FROM j WHERE {ai(ACTING, 'j.body', d=d)}",
        "an AI join in a derived table, then two of its columns": f"SELECT x.id, x.aspect FROM (SELECT r.id, r.body, "
                                                                  "a.aspect FROM reviews r JOIN aspects a ON "
                                                                  f"{ai(SHARED, 'r.body', 'a.aspect', d=d)}) x WHERE "
                                                                  f"{ai(WITH, 'x.body', 'x.aspect', d=d)} {union} "
                                                                  "SELECT 0, 'none'",
        "an AI join in one branch of a union": f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON "
                                               f"{ai(SHARED, 'r.body', 'a.aspect', d=d)} UNION ALL SELECT "
                                               f"e.evidence_id, 'x' FROM evidence e WHERE {coffee}",
        "EXISTS under OR": f"SELECT g.name FROM genres g WHERE g.genre_id <= 2 OR EXISTS (SELECT 1 FROM reviews r "
                           f"WHERE r.genre_id = g.genre_id AND {acting})",
        "a LEFT JOIN whose right side is an AI CTE": f"WITH liked AS (SELECT r.id, r.genre_id FROM reviews r WHERE "
                                                     f"{acting}) SELECT g.name, l.id FROM genres g LEFT JOIN liked l "
                                                     f"ON l.genre_id = g.genre_id WHERE {ai(PLOT, 'g.name', d=d)} IS "
                                                     "NOT TRUE",
        "a PIVOT over an AI block": (f"SELECT * FROM (SELECT r.genre_id, r.stars FROM reviews r WHERE {acting}) "
                                     "PIVOT (COUNT(stars) FOR genre_id IN (1, 2, 3))") if d == "snowflake" else
                                    (f"SELECT * FROM (SELECT r.genre_id, r.stars FROM reviews r WHERE {acting}) "
                                     "PIVOT (COUNT(stars) AS n FOR genre_id IN (1, 2, 3))"),
        "a NATURAL JOIN beside an AI filter": f"SELECT r.id, g.name FROM reviews r NATURAL JOIN genres g WHERE "
                                              f"{acting}",
        "two AI predicates over the same two tables, in a CTE": f"WITH j AS (SELECT r.id, a.aspect FROM reviews r JOIN "
                                                               f"aspects a ON {ai(SHARED, 'r.body', 'a.aspect', d=d)} "
                                                               f"AND {ai(WITH, 'r.body', 'a.aspect', d=d)}) SELECT "
                                                               "aspect, COUNT(*) AS n FROM j GROUP BY aspect",
        "two AI predicates over two tables in OR": f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON "
                                                  f"{ai(SHARED, 'r.body', 'a.aspect', d=d)} OR "
                                                  f"{ai(WITH, 'r.body', 'a.aspect', d=d)}",
        "an AI question over two tables in NOT and in SELECT": f"SELECT r.id, a.aspect, "
                                                               f"{ai(SHARED, 'r.body', 'a.aspect', d=d)} AS shared "
                                                               "FROM reviews r CROSS JOIN aspects a WHERE r.stars >= 4 "
                                                               f"AND NOT {ai(WITH, 'r.body', 'a.aspect', d=d)}",
        **({"a SEMI JOIN and an ANTI JOIN on AI": f"SELECT r.id FROM reviews r SEMI JOIN aspects a ON "
                                                  f"{ai(SHARED, 'r.body', 'a.aspect', d=d)} UNION ALL SELECT r.id FROM "
                                                  "reviews r ANTI JOIN aspects a ON "
                                                  f"{ai(WITH, 'r.body', 'a.aspect', d=d)}"}
           if d == "snowflake" else {}),
        "a RIGHT JOIN on AI": f"SELECT r.id, a.aspect FROM reviews r RIGHT JOIN aspects a ON "
                              f"{ai(SHARED, 'r.body', 'a.aspect', d=d)}",
        "a FULL OUTER JOIN on AI": f"SELECT r.id, a.aspect FROM reviews r FULL OUTER JOIN aspects a ON "
                                   f"{ai(SHARED, 'r.body', 'a.aspect', d=d)}",
        "a LEFT JOIN on AI beside a condition on the left table": (f"SELECT r.id, a.aspect FROM reviews r LEFT JOIN "
                                                                   "aspects a ON "
                                                                   f"{ai(SHARED, 'r.body', 'a.aspect', d=d)} AND "
                                                                   "r.stars > 2"),
        "a correlated count of an AI question over the outer row": ("SELECT r.id FROM reviews r WHERE r.stars > "
                                                                    "(SELECT COUNT(*) FROM aspects a WHERE "
                                                                    f"{ai(SHARED, 'a.aspect', 'r.title', d=d)})"),
        "an AI join beside a filter on a LEFT JOINed table": f"SELECT r.id, a.aspect, g.name FROM reviews r JOIN "
                                                             f"aspects a ON {ai(SHARED, 'r.body', 'a.aspect', d=d)} "
                                                             "LEFT JOIN genres g ON g.genre_id = r.genre_id WHERE "
                                                             f"{ai(PLOT, 'g.name', d=d)} IS NOT FALSE",
        "evidence matched to claims by a correlated AI test": f"SELECT c.claim_id FROM claims c WHERE EXISTS (SELECT 1 "
                                                             f"FROM evidence e WHERE e.source = c.url AND {coffee}) "
                                                             f"{union} SELECT c.claim_id FROM claims c WHERE c.text IS "
                                                             "NULL",
    }


CASES = [(d, name, sql) for d in ("snowflake", "bigquery")
         for name, sql in {**statements(d), **more_statements(d), **further_statements(d)}.items()]


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
    """A score over two tables as a value cannot be a lookup (it reads two tables, and only a TRUE/FALSE question
    is asked of pairs): the planner's refusal is what the user sees."""
    sql = ("SELECT r.id, AI.SCORE(PROMPT('Does {0} discuss {1}?', r.body, a.aspect)) AS s FROM reviews r JOIN "
           "aspects a ON r.stars = a.weight")
    with pytest.raises(quail.CompileError, match="reads the documents of exactly one table"):
        session.sql(sql)


def test_a_question_over_two_tables_outside_an_ai_join_is_asked_of_their_pairs(session):
    """In OR, the pairs its block's WHERE keeps are asked (once each), as an AI join of the two tables; the
    statement then reads whether each row's pair holds."""
    sql = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON r.stars >= a.weight WHERE r.id > 205 AND "
           "(r.stars = 5 OR AI_FILTER(PROMPT('Do {0} and {1} share a word?', r.body, a.aspect)))")
    query = session.sql(sql)
    assert isinstance(query, LookupQuery) and "over the pairs of its two tables" in query.explain()
    result = query.run()
    assert same_rows(result.collect(), oracle_rows(sql, "snowflake"), ordered=False) is None
    reviews = [r for r in TABLES["reviews"].to_pylist() if r["id"] > 205 and r["body"] is not None]
    aspects = [a for a in TABLES["aspects"].to_pylist() if a["aspect"] is not None]
    asked = (result.report["answers"]["computed"] or 0) + (result.report["answers"]["duplicates"] or 0)
    assert asked == len({(r["body"], a["aspect"]) for r in reviews for a in aspects
                         if r["stars"] is not None and a["weight"] is not None and r["stars"] >= a["weight"]}), \
        "each pair of documents whose rows pass the join's and the WHERE's own conditions, once"


def test_errors_of_the_statement_come_before_any_model_work(session):
    sql = f"SELECT r.id, r.nope FROM reviews r WHERE {ai(ACTING, 'r.body', dialect='snowflake')} UNION SELECT 1, 2"
    with pytest.raises(quail.CompileError, match="nope"):
        session.sql(sql)


def test_the_oracle_corpus_holds_at_least_250_statements_in_both_dialects():
    """This module's statements, the relational corpus and the warehouses' forms, each compared with the oracle."""
    from test_sql_relational import CASES as RELATIONAL
    from test_warehouse_forms import FORMS

    assert len(CASES) + len(RELATIONAL) + len(FORMS) >= 250
    assert {d for d, _, _ in CASES} == {d for d, _, _ in FORMS} == {"snowflake", "bigquery"}


def test_a_correlated_equality_narrows_the_inner_table_to_the_outer_tables_values(session):
    """`r.genre_id = g.genre_id` inside EXISTS: the lookup reads only reviews whose genre the outer block keeps
    (its own top-level conditions included); under OR the outer conditions do not decide, and are not used."""
    exists = (f"EXISTS (SELECT 1 FROM reviews r WHERE r.genre_id = g.genre_id AND "
              f"{ai(ACTING, 'r.body', dialect='snowflake')})")
    narrow = f"SELECT g.name FROM genres g WHERE g.genre_id <= 2 AND {exists}"
    under_or = f"SELECT g.name FROM genres g WHERE g.genre_id <= 2 OR {exists}"
    shown = session.sql(narrow).explain()
    assert "r.genre_id IN (SELECT g.genre_id FROM genres AS g WHERE g.genre_id <= 2)" in shown
    assert "r.genre_id IN (SELECT g.genre_id FROM genres AS g)" in session.sql(under_or).explain()
    narrowed, wide = session.sql(narrow).run(), session.sql(under_or).run()
    assert narrowed.report["fresh_tokens"] < wide.report["fresh_tokens"]
    for sql, result in ((narrow, narrowed), (under_or, wide)):
        assert same_rows(result.collect(), oracle_rows(sql, "snowflake"), ordered=False) is None


def test_calls_of_two_blocks_over_the_same_rows_are_asked_as_one_query(session):
    """Two branches of a UNION read the same rows of one table: their calls are one query's outputs (each document
    tokenized once, its KV shared by the calls); a third over other rows stays a lookup of its own."""
    sql = ("SELECT r.id, AI_CLASSIFY(r.body, ['acting', 'plot']) AS c FROM reviews r WHERE r.stars > 1 "
           "UNION ALL SELECT r.id, CAST(AI_FILTER(PROMPT('Is {0} about \"acting\"?', r.body)) AS VARCHAR) "
           "FROM reviews r WHERE r.stars > 1 "
           "UNION ALL SELECT r.id, CAST(AI.SCORE(PROMPT('Is {0} good?', r.body)) > 0.5 AS VARCHAR) FROM reviews r")
    query = session.sql(sql)
    assert isinstance(query, LookupQuery)
    text = query.explain()
    assert text.count("asked as one query over the same rows (2 calls, v0 … v1)") == 1
    result = query.run()
    problem = same_rows(result.collect(), oracle_rows(sql, "snowflake"), ordered=False)
    assert problem is None, problem
    models = {name.split("/")[0] for name in result.report["node_metrics"]}
    assert len(models) == 2, "one query for the two calls over the same rows, one for the third"
