"""A LIMIT met early: the model reads documents in rounds and stops once the rows are there — the same rows as
reading them all (`early_limit="off"`), for a fraction of the tokens. Keyword backend: a row qualifies when its
body says "acting", so every answer can be checked independently of the engine."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import quail
from quail.errors import ConfigError
from quail.testing import BASE_MODEL, ByteTokenizer, KeywordBackend

ACTING = "AI_FILTER(PROMPT('Does the review praise the \"acting\"? {0}', t.body))"
DISCUSS = "AI_FILTER(PROMPT('Does the review {0} discuss {1}?', t.body, a.aspect))"


def bodies(count: int, share: float, seed: int) -> list[str]:
    chosen = random.Random(seed)
    return [("the acting was great " if chosen.random() < share else "the plot was fine ") + f"review {i}"
            for i in range(count)]


def session(texts: list[str], early_limit: str = "auto", cache: str = "off", compute: str = "local") -> quail.Session:
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(tokenizer))
    backend = "example-keyword" if compute == "process" else "keyword"  # a worker finds it by its entry point
    config = quail.EngineConfig(model=BASE_MODEL, backend=backend, cache=cache, early_limit=early_limit,
                                compute=compute)
    opened = quail.Session(config, registry=registry, tokenizer=tokenizer)
    opened.register("t", pa.table({"id": list(range(len(texts))), "body": texts}))
    opened.register("a", pa.table({"aid": [1, 2, 3], "aspect": ["acting", "plot", "music"]}))
    return opened


def run(texts: list[str], sql: str, **settings: str) -> quail.QueryResult:
    with session(texts, **settings) as opened:
        return opened.sql(sql).run()


@pytest.fixture(scope="module")
def thousand() -> Iterator[list[str]]:
    yield bodies(1000, 0.3, seed=7)


def test_a_limit_5_filter_over_1000_documents_reads_a_few_percent_of_them_for_the_same_rows(thousand):
    sql = f"SELECT t.id FROM t WHERE {ACTING} LIMIT 5"
    early, whole = run(thousand, sql), run(thousand, sql, early_limit="off")
    assert early.to_rows() == whole.to_rows() and len(early) == 5
    assert all("acting" in thousand[row["id"]] for row in early.to_rows())
    assert early.report["fresh_tokens"] <= 0.1 * whole.report["fresh_tokens"]
    assert "stopped after" in early.explain() and "the LIMIT had its rows" in early.explain()
    assert "stopped after" not in whole.explain()


def test_a_limit_10_join_stops_reading_partners_early_for_the_same_rows(thousand):
    sql = f"SELECT t.id, a.aid FROM t JOIN a ON {DISCUSS} LIMIT 10"
    early, whole = run(thousand, sql), run(thousand, sql, early_limit="off")
    assert early.to_rows() == whole.to_rows() and len(early) == 10
    assert early.report["fresh_tokens"] <= 0.1 * whole.report["fresh_tokens"]


def test_explain_says_the_rounds_before_any_model_work(thousand):
    with session(thousand) as opened:
        text = opened.sql(f"SELECT t.id FROM t WHERE {ACTING} LIMIT 5").explain()
    assert "LIMIT 5 met early: the model reads the 1,000 documents of t in rounds of" in text
    with session(thousand, early_limit="off") as opened:
        assert "met early" not in opened.sql(f"SELECT t.id FROM t WHERE {ACTING} LIMIT 5").explain()


def test_a_limit_after_grouping_or_ordering_by_a_score_reads_every_document(thousand):
    score = "AI.SCORE(PROMPT('How much does {0} praise the \"acting\"?', t.body))"
    for sql in (f"SELECT COUNT(*) AS n FROM t WHERE {ACTING} LIMIT 1",
                f"SELECT t.id, {score} AS s FROM t ORDER BY s DESC LIMIT 3"):
        early, whole = run(thousand[:200], sql), run(thousand[:200], sql, early_limit="off")
        assert early.to_rows() == whole.to_rows()
        assert early.report["fresh_tokens"] == whole.report["fresh_tokens"]
        assert "stopped after" not in early.explain()


@settings(max_examples=20, deadline=None)
@given(limit=st.integers(1, 12), descending=st.booleans(), seed=st.integers(0, 5), offset=st.integers(0, 3))
def test_order_by_a_column_then_limit_reads_in_that_order_and_stops(limit, descending, seed, offset):
    texts = bodies(400, 0.3, seed)
    keys = random.Random(seed).sample(range(10_000), len(texts))  # unique: the first rows in order are one set
    direction = "DESC" if descending else "ASC"
    with session(texts) as opened:
        opened.register("u", pa.table({"id": list(range(len(texts))), "body": texts, "k": keys}))
        result = opened.sql(f"SELECT u.id FROM u WHERE {ACTING.replace('t.body', 'u.body')} ORDER BY u.k "
                            f"{direction} LIMIT {limit} OFFSET {offset}").run()
    ranked = sorted((i for i, text in enumerate(texts) if "acting" in text), key=lambda i: keys[i],
                    reverse=descending)
    assert [row["id"] for row in result.to_rows()] == ranked[offset:offset + limit]
    assert "stopped after" in result.explain()


def test_the_process_provider_stops_early_too(thousand):
    sql = f"SELECT t.id FROM t WHERE {ACTING} LIMIT 3"
    early = run(thousand[:300], sql, compute="process")
    whole = run(thousand[:300], sql, early_limit="off")
    assert early.to_rows() == whole.to_rows()
    assert early.report["fresh_tokens"] < 0.2 * whole.report["fresh_tokens"]


def test_early_limit_takes_auto_on_or_off():
    with pytest.raises(ConfigError, match="early_limit"):
        quail.EngineConfig(early_limit="sometimes")  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(0, 160), share=st.sampled_from([0.0, 0.05, 0.3, 0.9]), limit=st.integers(0, 40),
       seed=st.integers(0, 3), stored=st.integers(0, 160), join=st.booleans())
def test_rows_equal_reading_every_document_whatever_the_limit_selectivity_and_stored_answers(
        tmp_path_factory, count, share, limit, seed, stored, join):
    texts = bodies(count, share, seed)
    store = str(tmp_path_factory.mktemp("store") / "answers.sqlite")
    predicate = DISCUSS if join else ACTING
    select = "t.id, a.aid FROM t JOIN a ON" if join else "t.id FROM t WHERE"
    with session(texts, cache=store) as opened:  # some answers already stored, in no particular order
        opened.sql(f"SELECT {select} {predicate} AND t.id % 3 = 1 AND t.id < {stored}").run()
    sql = f"SELECT {select} {predicate} LIMIT {limit}"
    early = run(texts, sql, cache=store).to_rows()
    whole = run(texts, sql, early_limit="off").to_rows()
    assert early == whole
    qualifying = sum("acting" in text for text in texts) if not join else len(whole)
    assert len(early) == min(limit, qualifying)
