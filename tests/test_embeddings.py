"""Embeddings in SQL on the keyword test backend: AI.EMBED / AI_EMBED and AI.SIMILARITY / AI_SIMILARITY in both
dialects, against an oracle that embeds each text with the same rule (`quail.testing.rules.embedded_vector`) and
takes cosines in numpy; the warehouses' argument forms; the model a call names; NULLs; the answer store; explain.
The real encoder (all-MiniLM-L6-v2 against sentence-transformers) is tested in quail-native."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.relational_oracle import TABLES, keyword_session

import quail
from quail.catalog.models import ALL_MINILM_L6_V2
from quail.errors import ConfigError
from quail.testing import ByteTokenizer, KeywordBackend
from quail.testing.rules import embedded_vector

DIMENSIONS = ALL_MINILM_L6_V2.dimensions
WAREHOUSE_MODELS = {"text-embedding-005": ALL_MINILM_L6_V2.name, "snowflake-arctic-embed-l-v2.0": ALL_MINILM_L6_V2.name}
"""The warehouses' embedding models the statements here name, as aliases of the one Quail has."""


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with keyword_session(aliases=WAREHOUSE_MODELS) as opened:
        yield opened


def vector(text: str) -> np.ndarray:
    return np.asarray(embedded_vector(text, DIMENSIONS), np.float64)


def cosine(a: str | None, b: str | None) -> float | None:
    if a is None or b is None:
        return None
    first, second = vector(a), vector(b)
    return float(first @ second / (np.linalg.norm(first) * np.linalg.norm(second)))


def reviews() -> list[dict[str, object]]:
    return TABLES["reviews"].to_pylist()


SEARCH = {
    "snowflake": "SELECT r.id, AI_SIMILARITY(r.body, 'the acting is superb') AS s FROM reviews r "
                 "ORDER BY s DESC NULLS LAST, r.id LIMIT 5",
    "bigquery": "SELECT r.id, AI.SIMILARITY(content1 => r.body, content2 => 'the acting is superb', "
                "endpoint => 'text-embedding-005') AS s FROM reviews r ORDER BY s DESC NULLS LAST, r.id LIMIT 5",
}


@pytest.mark.parametrize("dialect", ["snowflake", "bigquery"])
def test_semantic_search_ranks_by_the_cosine_of_the_embeddings(session, dialect):
    got = session.sql(SEARCH[dialect], dialect=dialect).run().collect().to_pylist()
    expected = sorted(((r["id"], cosine(r["body"], "the acting is superb")) for r in reviews()
                       if r["body"] is not None), key=lambda item: (-item[1], item[0]))[:5]
    assert [row["id"] for row in got] == [i for i, _ in expected]
    assert np.allclose([row["s"] for row in got], [s for _, s in expected], atol=1e-6)


def test_ai_embed_returns_each_texts_vector_in_both_spellings(session):
    snowflake = session.sql("SELECT r.id, AI_EMBED('all-minilm-l6-v2', r.body) AS v FROM reviews r "
                            "ORDER BY r.id").run().collect()
    bigquery = session.sql("SELECT r.id, AI.EMBED(r.body, endpoint => 'all-minilm-l6-v2') AS e FROM reviews r "
                           "ORDER BY r.id", dialect="bigquery").run().collect()
    assert snowflake.schema.field("v").type == pa.list_(pa.float32())
    assert bigquery.schema.field("e").type == pa.struct([("result", pa.list_(pa.float32())), ("status", pa.string())])
    for row, struct, review in zip(snowflake.to_pylist(), bigquery.to_pylist(), sorted(reviews(),
                                                                                       key=lambda r: r["id"]),
                                   strict=True):
        if review["body"] is None:
            assert row["v"] is None and struct["e"] is None
            continue
        assert np.allclose(row["v"], vector(review["body"]), atol=1e-7)
        assert struct["e"] == {"result": row["v"], "status": ""}


def test_a_similarity_filter_and_an_ai_filter_combine(session):
    sql = ("SELECT r.id FROM reviews r WHERE AI_SIMILARITY(r.body, 'great acting and a moving plot') > 0.2 "
           "AND AI_FILTER(PROMPT('Does the review praise the \"acting\"? {0}', r.body)) ORDER BY r.id")
    got = [row["id"] for row in session.sql(sql).run().collect().to_pylist()]
    expected = [r["id"] for r in sorted(reviews(), key=lambda r: r["id"])
                if r["body"] is not None and "acting" in r["body"].lower()
                and cosine(r["body"], "great acting and a moving plot") > 0.2]
    assert got == expected and got


def test_a_similarity_join_embeds_each_side_once(session):
    sql = ("SELECT r.id, a.aspect_id FROM reviews r JOIN aspects a ON AI_SIMILARITY(r.body, a.aspect) > 0.15 "
           "ORDER BY r.id, a.aspect_id")
    result = session.sql(sql).run()
    aspects = TABLES["aspects"].to_pylist()
    expected = [(r["id"], a["aspect_id"]) for r in sorted(reviews(), key=lambda r: r["id"])
                for a in sorted(aspects, key=lambda a: a["aspect_id"])
                if (c := cosine(r["body"], a["aspect"])) is not None and c > 0.15]
    assert [(row["id"], row["aspect_id"]) for row in result.collect().to_pylist()] == expected
    computed = sum(m.computed_answers or 0 for m in result.query_report.node_metrics.values())
    texts = [r["body"] for r in reviews()] + [a["aspect"] for a in aspects]
    distinct = len({r["body"] for r in reviews()} - {None}) + len({a["aspect"] for a in aspects} - {None})
    assert distinct < len(texts)
    assert computed == distinct  # each distinct text once, not once per pair


def test_null_text_gives_null_embedding_and_similarity(session):
    rows = session.sql("SELECT r.id, AI_EMBED(r.body) AS v, AI_SIMILARITY(r.body, 'plot') AS s FROM reviews r "
                       "WHERE r.body IS NULL").run().collect().to_pylist()
    assert rows and all(row["v"] is None and row["s"] is None for row in rows)


def test_embeddings_are_stored_and_never_computed_twice():
    sql = SEARCH["snowflake"]
    with tempfile.TemporaryDirectory() as directory, keyword_session(Path(directory) / "a.sqlite") as opened:
        first = opened.sql(sql).run()
        again = opened.sql(sql).run()
    assert first.collect() == again.collect()
    assert first.report["fresh_tokens"] > 0 and again.report["fresh_tokens"] == 0


def test_explain_shows_the_embedding_work_before_any_model_work(session):
    text = session.sql(SEARCH["snowflake"]).explain()
    assert "AiEmbed d AS v (384 dimensions)" in text and "tokens≈" in text
    assert "embedded by all-minilm-l6-v2" in text


def test_a_warehouse_model_name_is_an_alias_said_in_the_report_and_an_unknown_one_is_refused(session):
    result = session.sql("SELECT AI_EMBED('snowflake-arctic-embed-l-v2.0', r.body) AS v FROM reviews r").run()
    assert "AI_EMBED: model 'snowflake-arctic-embed-l-v2.0' stands for all-minilm-l6-v2 (EngineConfig.model_aliases)" \
        in result.query_report.remarks
    with pytest.raises(quail.CompileError, match=r"AI_EMBED names model 'voyage-2', which is neither one of Quail's "
                                                 r"embedding models \(all-minilm-l6-v2\) nor an alias"):
        session.sql("SELECT AI_EMBED('voyage-2', r.body) AS v FROM reviews r")


@pytest.mark.parametrize(("sql", "dialect", "message"), [
    ("SELECT AI_EMBED('gemma-3-270m', r.body) FROM reviews r", "snowflake", "not an embedding model"),
    ("SELECT AI_SIMILARITY(r.body) FROM reviews r", "snowflake", "compares two texts"),
    ("SELECT AI.EMBED(r.body, title => 'x') FROM reviews r", "bigquery", "title"),
    ("SELECT AI.EMBED(r.body, colour => 'x') FROM reviews r", "bigquery", "has no argument 'colour'"),
    ("SELECT AI_SIMILARITY(r.body, 'x', {'dims': 3}) FROM reviews r", "snowflake", "'model'"),
    ("SELECT * FROM VECTOR_SEARCH(TABLE reviews, 'body', 'x')", "bigquery", "VECTOR_SEARCH"),
])
def test_bad_embedding_calls_are_refused_before_any_model_work(session, sql, dialect, message):
    with pytest.raises(quail.CompileError, match=message):
        session.sql(sql, dialect=dialect)


def test_the_session_model_and_the_embedding_model_must_be_of_their_kinds():
    with pytest.raises(ConfigError, match="is an embedding model"):
        quail.Session(quail.EngineConfig(model="all-minilm-l6-v2", backend="keyword"),
                      registry=_registry(), tokenizer=ByteTokenizer())
    with pytest.raises(ConfigError, match="not an embedding model"):
        quail.Session(quail.EngineConfig(embedding_model="gemma-3-270m", backend="keyword"),
                      registry=_registry(), tokenizer=ByteTokenizer())


def _registry() -> quail.ExtensionRegistry:
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(ByteTokenizer()))
    return registry


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT AI_EMBED(r.body, {'dims': 3}) FROM reviews r", "its one option is"),
    ("SELECT AI_EMBED(r.body, {'Model': 'gemma-3-270m'}) FROM reviews r", "not an embedding model"),
    ("SELECT r.id FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('Is {0} about {1}?', r.body, a.aspect), "
     "{'blocking': 'top_k', 'k': 2, 'embedding_model': 'gemma-3-270m'})", "not an embedding model"),
])
def test_embedding_options_are_checked(session, sql, message):
    with pytest.raises(quail.CompileError, match=message):
        session.sql(sql)


def test_one_text_is_embedded_once_whatever_the_spelling(session):
    sql = ("SELECT r.id, AI.EMBED(r.body) AS e, AI.SIMILARITY(content1 => r.body, content2 => 'plot') AS s, "
           "AI_EMBED(r.body) AS v FROM reviews r ORDER BY r.id")
    query = session.sql(sql, dialect="bigquery")
    assert len(query.lookups) == 2  # r.body once (three calls), 'plot' once
    rows = query.run().collect().to_pylist()
    for row in rows:
        if row["v"] is None:
            assert row["e"] is None and row["s"] is None
        else:
            assert row["e"] == {"result": row["v"], "status": ""}
