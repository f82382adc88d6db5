"""Two (or more) AI predicates over the same two tables in one query block — in one ON, or one in ON and one in
WHERE: the first is asked alone over the pairs the block's other conditions keep, the rest only of the pairs it holds
for (`quail.frontend.chains`). Against the oracle (DuckDB running the statement with the keyword rule as UDFs), in
both dialects, and counting what the model is asked. Random chains of tables with a second AI predicate are in
test_join_chains.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.relational_oracle import keyword_session, oracle_rows, same_rows

import quail

DISCUSS = "AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))"
PRAISE = "AI_FILTER(PROMPT('Does {0} or {1} say \"great\"?', r.body, a.aspect))"
TITLE = "AI_FILTER(PROMPT('Do {0} and {1} share a word?', r.title, a.aspect))"

STATEMENTS = [
    ("snowflake", f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {DISCUSS} AND {PRAISE}"),
    ("snowflake", f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {PRAISE} WHERE {DISCUSS} AND r.stars > 1"),
    ("bigquery", "SELECT r.id, a.aspect_id FROM reviews r JOIN aspects a ON AI.IF(('Does ', r.body, ' discuss ', "
                 "a.aspect, '?')) AND AI.IF(('Does ', r.body, ' or ', a.aspect, ' say \"great\"?')) "
                 "WHERE a.weight >= 2"),
    ("snowflake", f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {DISCUSS} AND {PRAISE} AND {TITLE}"),
    ("snowflake", f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {DISCUSS} AND {PRAISE} "
                  "AND r.id + a.aspect_id > 15 "
                  "WHERE AI_FILTER(PROMPT('Is {0} about \"acting\"?', r.body)) OR r.stars = 5"),
    ("snowflake", f"SELECT * FROM reviews r JOIN aspects a ON {DISCUSS} AND {PRAISE} WHERE r.stars IS NOT NULL"),
    ("snowflake", f"WITH hits AS (SELECT r.id, r.stars, a.aspect FROM reviews r JOIN aspects a ON {DISCUSS} "
                  f"AND {PRAISE}) SELECT aspect, COUNT(*) AS n, MAX(stars) AS best FROM hits GROUP BY aspect "
                  "ORDER BY n DESC, aspect"),
    ("snowflake", f"SELECT r.id, g.name, a.aspect FROM reviews r JOIN genres g ON g.genre_id = r.genre_id "
                  f"JOIN aspects a ON {DISCUSS} AND {PRAISE}"),
    ("snowflake", "SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON "
                  "AI_FILTER(PROMPT('Does {0} say \"nothing\" of {1}?', r.body, a.aspect)) AND " + PRAISE),
]


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with keyword_session() as opened:
        yield opened


@pytest.mark.parametrize(("dialect", "sql"), STATEMENTS, ids=[s[:90] for _, s in STATEMENTS])
def test_two_ai_predicates_over_two_tables_answer_as_the_oracle(session, dialect, sql):
    got = session.sql(sql, dialect=dialect).run().collect()
    problem = same_rows(got, oracle_rows(sql, dialect), ordered="ORDER BY" in sql)
    assert problem is None, problem


def test_the_first_is_asked_every_pair_and_the_second_only_those_the_first_holds_for(session):
    sql = f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {DISCUSS} AND {PRAISE} WHERE r.stars > 1"
    query = session.sql(sql)
    result = query.run()
    metrics = result.report["node_metrics"]
    [first] = [m for name, m in metrics.items() if name.startswith("pairs/join_")]
    [second] = [m for name, m in metrics.items() if name.startswith("rest/join_")]
    bodies = {r["body"] for r in session.sql("SELECT body FROM reviews WHERE stars > 1 AND body IS NOT NULL")
              .run().to_rows()}
    aspects = {r["aspect"] for r in session.sql("SELECT aspect FROM aspects WHERE aspect IS NOT NULL").run()
               .to_rows()}
    held = oracle_rows(f"SELECT DISTINCT r.body, a.aspect FROM reviews r JOIN aspects a ON {DISCUSS} "
                       "WHERE r.stars > 1", "snowflake").num_rows
    assert first["computed_answers"] == len(bodies) * len(aspects), "every pair the block's conditions keep"
    assert second["computed_answers"] == held, "only the pairs the first holds for"
    assert any("pair(s) of documents hold for the first" in r for r in result.report["remarks"])


def test_explain_shows_both_steps_and_runs_no_model(session):
    text = session.sql(f"SELECT r.id FROM reviews r JOIN aspects a ON {DISCUSS} AND {PRAISE}").explain()
    assert "== two AI predicates over r and a:" in text
    assert "-- step 1, the pairs the first predicate holds for:" in text and "AiJoin" in text
    assert "planned when step 1 has answered" in text and "Does {0} or {1} say" in text


def test_two_ai_predicates_in_a_left_joins_on_are_asked_of_the_pairs_and_keep_unmatched_rows(session):
    """In a LEFT JOIN's ON a pair failing either predicate still keeps its left row: no chain there; each question is
    asked of the two tables' pairs by the general rule, and DuckDB runs the LEFT JOIN."""
    sql = f"SELECT r.id, a.aspect FROM reviews r LEFT JOIN aspects a ON {DISCUSS} AND {PRAISE}"
    query = session.sql(sql)
    assert not isinstance(query, quail.Query)
    problem = same_rows(query.run().collect(), oracle_rows(sql, "snowflake"), ordered=False)
    assert problem is None, problem


@pytest.mark.parametrize("column", ["r.body", "r.title"])
def test_a_filter_on_one_of_the_two_tables_is_asked_in_the_first_step_only(session, column):
    """The first step applies the block's AI filter on the reviews (and keys its pairs by the column it reads), so
    the second never asks it again — with the answer store off, each review is asked once."""
    sql = (f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON {DISCUSS} AND {PRAISE} "
           f"WHERE AI_FILTER(PROMPT('Is {{0}} about \"acting\"?', {column})) AND r.stars > 1")
    result = session.sql(sql).run()
    problem = same_rows(result.collect(), oracle_rows(sql, "snowflake"), ordered=False)
    assert problem is None, problem
    filters = [name for name in result.report["node_metrics"] if name.split("/")[-1].startswith("filter_")]
    assert len(filters) == 1 and filters[0].startswith("pairs/"), filters
