"""Conditions between two joined tables run below the model: the pairs a join asks are exactly the pairs that satisfy
them — equalities, inequalities, ranges, any DuckDB expression — enumerated by DuckDB. The condition stays where the
query wrote it too, so rows never change; only the pairs asked do. Keyword backend: every answer is checkable."""

from __future__ import annotations

import itertools
import re

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.cases import empty_keyword_session

import quail
from quail.testing.rules import predicate_margin

SHARE = "PROMPT('Do {0} and {1} share a word?', r1.body, r2.body)"
WORDS = ["acting", "plot", "music", "score", "cast", "pace"]
CONDITIONS = {
    "r1.id < r2.id": lambda a, b: a["id"] < b["id"],
    "r1.stars + 1 < r2.stars": lambda a, b: a["stars"] + 1 < b["stars"],
    "abs(r1.stars - r2.stars) BETWEEN 1 AND 2": lambda a, b: 1 <= abs(a["stars"] - b["stars"]) <= 2,
    "r1.movie = r2.movie AND r1.id <> r2.id": lambda a, b: a["movie"] == b["movie"] and a["id"] != b["id"],
    "r1.body < r2.body": lambda a, b: a["body"] < b["body"],
}


def session(rows: list[dict[str, object]]) -> quail.Session:
    opened = empty_keyword_session(cache="off")
    opened.register("reviews", pa.Table.from_pylist(rows))
    return opened


def run(rows: list[dict[str, object]], sql: str) -> quail.QueryResult:
    with session(rows) as opened:
        return opened.sql(sql).run()


reviews = st.lists(st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
                             st.integers(1, 5), st.integers(1, 2)), min_size=1, max_size=8)


@settings(max_examples=30, deadline=None)
@given(reviews, st.sampled_from(sorted(CONDITIONS)), st.booleans())
def test_the_model_is_asked_exactly_the_pairs_that_satisfy_the_condition(written, condition, in_on):
    rows = [{"id": i, "body": body, "stars": stars, "movie": movie} for i, (body, stars, movie) in enumerate(written)]
    where = (f"FROM reviews r1 JOIN reviews r2 ON {condition} WHERE AI_FILTER({SHARE})" if in_on else
             f"FROM reviews r1 JOIN reviews r2 ON AI_FILTER({SHARE}) WHERE {condition}")
    result = run(rows, f"SELECT r1.id AS a, r2.id AS b {where} ORDER BY a, b")
    holds = CONDITIONS[condition]
    satisfying = [(a, b) for a, b in itertools.product(rows, rows) if holds(a, b)]
    distinct_prompts = {(a["body"], b["body"]) for a, b in satisfying}
    assert (result.report["answers"]["computed"] or 0) == len(distinct_prompts)  # None: nothing to ask
    expected = sorted((a["id"], b["id"]) for a, b in satisfying
                      if predicate_margin("Do {0} and {1} share a word?", [a["body"], b["body"]]) > 0)
    assert [(r["a"], r["b"]) for r in result.to_rows()] == expected


def test_explain_shows_the_condition_on_the_candidate_pairs():
    rows = [{"id": i, "body": "acting plot", "stars": i, "movie": 1} for i in range(4)]
    with session(rows) as opened:
        text = opened.sql(f"SELECT r1.id FROM reviews r1 JOIN reviews r2 ON r1.id < r2.id "
                           f"WHERE AI_FILTER({SHARE})").explain()
    assert 'HashJoin "r1.id" < "r2.id"' in text


def test_a_condition_on_a_left_joins_partner_or_with_a_subquery_stays_above_the_model():
    rows = [{"id": i, "body": "acting plot", "stars": i, "movie": 1} for i in range(4)]
    sql = (f"SELECT r1.id AS a, r2.id AS b FROM reviews r1 JOIN reviews r2 ON AI_FILTER({SHARE}) "
           "WHERE r1.id < r2.id AND r2.stars > (SELECT MIN(stars) FROM reviews) ORDER BY a, b")
    result = run(rows, sql)
    assert result.report["answers"]["computed"] == 1  # every pair shares a prompt: one computed, the rest copied
    assert [(r["a"], r["b"]) for r in result.to_rows()] == [(a, b) for a in range(4) for b in range(4)
                                                             if a < b and b > 0]


@settings(max_examples=30, deadline=None)
@given(reviews, st.sampled_from(sorted(CONDITIONS)))
def test_a_left_joins_own_condition_decides_which_pairs_match_and_is_all_the_model_is_asked(written, condition):
    """`LEFT JOIN r2 ON <condition> AND AI_FILTER(...)`: a left row keeps the partners that satisfy both, and is
    NULL-extended when none does — the condition is part of the match, not a filter after it."""
    rows = [{"id": i, "body": body, "stars": stars, "movie": movie} for i, (body, stars, movie) in enumerate(written)]
    result = run(rows, f"SELECT r1.id AS a, r2.id AS b FROM reviews r1 LEFT JOIN reviews r2 "
                       f"ON {condition} AND AI_FILTER({SHARE}) ORDER BY a, b NULLS FIRST")
    holds = CONDITIONS[condition]
    shares = {(a["id"], b["id"]) for a, b in itertools.product(rows, rows)
              if holds(a, b) and predicate_margin("Do {0} and {1} share a word?", [a["body"], b["body"]]) > 0}
    expected = sorted((a["id"], b) for a in rows
                      for b in ([b["id"] for b in rows if (a["id"], b["id"]) in shares] or [None]))
    assert [(r["a"], r["b"]) for r in result.to_rows()] == sorted(expected, key=lambda p: (p[0], p[1] is not None,
                                                                                             p[1] or 0))
    satisfying = {(a["body"], b["body"]) for a, b in itertools.product(rows, rows) if holds(a, b)}
    assert (result.report["answers"]["computed"] or 0) == len(satisfying)


@pytest.mark.parametrize(("on", "words"), [
    ("r2.id < r3.id", "refers to 'r3', which is joined later"),
])
def test_a_left_joins_condition_it_cannot_take_is_refused_naming_why(on, words):
    rows = [{"id": i, "body": "acting plot", "stars": i, "movie": 1} for i in range(3)]
    with session(rows) as opened:
        opened.register("more", pa.Table.from_pylist(rows))
        with pytest.raises(quail.CompileError, match=re.escape(words)):
            opened.sql(f"SELECT r1.id FROM reviews r1 LEFT JOIN reviews r2 ON {on} AND AI_FILTER({SHARE}) "
                       "JOIN more r3 ON r3.id = r1.id")


def test_a_left_joins_condition_may_name_its_columns_unqualified():
    rows = [{"id": i, "body": body, "stars": i % 3} for i, body in enumerate(["acting plot", "music", "plot", "pace"])]
    topics = [{"tid": t, "topic": topic, "weight": t} for t, topic in enumerate(["acting", "plot", "music"])]
    asks = "AI_FILTER(PROMPT('Does {0} mention {1}?', r.body, topic))"
    with session(rows) as opened:
        opened.register("topics", pa.Table.from_pylist(topics))
        written = [opened.sql(f"SELECT r.id, t.tid FROM reviews r LEFT JOIN topics t ON {on} AND {asks} "
                              "ORDER BY 1, 2 NULLS FIRST").run() for on in ("stars < weight", "r.stars < t.weight")]
    expected = sorted((r["id"], t["tid"]) for r in rows for t in topics if r["stars"] < t["weight"]
                       and predicate_margin("Does {0} mention {1}?", [r["body"], t["topic"]]) > 0)
    expected += [(r["id"], None) for r in rows if not any(a == r["id"] for a, _ in expected)]
    for result in written:
        assert sorted([(x["id"], x["tid"]) for x in result.to_rows()], key=str) == sorted(expected, key=str)
    assert written[0].report["answers"]["computed"] == written[1].report["answers"]["computed"]
