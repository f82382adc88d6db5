"""`{'symmetric': TRUE}`: a question over two documents whose answer does not depend on their order is asked once
per unordered pair, and both orders read that answer. Keyword backend (its two-document rule is symmetric, so the
rows equal the plain join's; what changes is how many prompts the backend is asked)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import quail
from quail import col, prompt
from quail.errors import CompileError
from quail.testing import BASE_MODEL, ByteTokenizer, KeywordBackend

SAME = "PROMPT('Do {0} and {1} share a word?', r1.body, r2.body)"
WORDS = ["acting", "plot", "music", "score", "cast", "pace"]


def session(bodies: list[str]) -> quail.Session:
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(tokenizer))
    opened = quail.Session(quail.EngineConfig(model=BASE_MODEL, backend="keyword", cache="off"), registry=registry,
                           tokenizer=tokenizer)
    opened.register("reviews", pa.table({"id": list(range(len(bodies))), "body": bodies}))
    return opened


def self_join(bodies: list[str], options: str = "", condition: str = "") -> quail.QueryResult:
    with session(bodies) as opened:
        return opened.sql(f"SELECT r1.id AS a, r2.id AS b FROM reviews r1 JOIN reviews r2 ON "
                          f"AI_FILTER({SAME}{options}){condition} ORDER BY a, b").run()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join), min_size=1, max_size=7,
                unique=True))
def test_each_unordered_pair_is_asked_once_and_the_rows_are_the_plain_joins(bodies):
    plain, symmetric = self_join(bodies), self_join(bodies, ", {'symmetric': TRUE}")
    assert symmetric.to_rows() == plain.to_rows()
    n = len(bodies)
    assert plain.report["answers"]["computed"] == n * n
    assert symmetric.report["answers"]["computed"] == n * (n + 1) // 2  # (a, b) and (b, a) once; (a, a) once
    assert symmetric.report["answers"]["duplicates"] == n * (n - 1) // 2
    pairs = {(row["a"], row["b"]) for row in symmetric.to_rows()}
    assert all((b, a) in pairs for a, b in pairs)


def test_a_pair_asked_in_one_order_only_is_asked_as_written():
    bodies = ["acting plot", "plot music", "music acting"]
    plain = self_join(bodies, condition=" AND r1.id < r2.id")
    symmetric = self_join(bodies, ", {'symmetric': TRUE}", " AND r1.id < r2.id")
    assert symmetric.to_rows() == plain.to_rows()


def test_the_builder_says_symmetric_too():
    bodies = ["acting plot", "plot music", "music acting", "pace"]
    with session(bodies) as opened:
        query = (opened.docs("reviews").alias("r1")
                 .ai_join(opened.docs("reviews").alias("r2"),
                          prompt("Do {0} and {1} share a word?", col("r1.body"), col("r2.body"), symmetric=True))
                 .select("r1.id", "r2.id"))
        result = query.run()
    assert result.report["answers"]["computed"] == 10
    assert "(symmetric)" in result.explain()


def test_symmetric_needs_two_tables_and_a_boolean():
    with session(["acting"]) as opened:
        with pytest.raises(CompileError, match="two documents of two tables"):
            opened.sql("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), "
                       "{'symmetric': TRUE})")
        with pytest.raises(CompileError, match="symmetric is TRUE or FALSE"):
            opened.sql(f"SELECT r1.id FROM reviews r1 JOIN reviews r2 ON AI_FILTER({SAME}, {{'symmetric': 'yes'}})")
