"""The main job: a two-filter + join query over the bundled movie reviews on the embedded model."""

from __future__ import annotations

import sys
from typing import TextIO

from quail.config import EngineConfig
from quail.data.providers import DocumentProvider
from quail.presentation import format_report, format_rows, progress_bar
from quail.session import Session

DEMO_SQL = """\
SELECT r.id, r.title, a.aspect
FROM reviews r
JOIN aspects a
  ON AI_FILTER(PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect))
WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body), {'selectivity': 0.45})
  AND AI_FILTER(PROMPT('Would the reviewer recommend this movie to a friend? {0}', r.body),
                {'selectivity': 0.5})"""

MODEL_NOTES = {
    "gemma-3-270m": "Gemma 3 270M is a small base model: it shows the engine's speed, not answer quality "
                    "(quail bench --quality).",
    "qwen2.5-coder-0.5b-instruct": "Qwen2.5-Coder 0.5B is fast but often wrong; the default 1.5B answers far better "
                                   "(quail bench --quality).",
    "qwen2.5-coder-1.5b-instruct": "Qwen2.5-Coder 1.5B Instruct (the default): mean AUC 0.90 and accuracy 0.76 on "
                                   "the bundled labeled reviews (quail bench --quality); --model gemma-3-270m is "
                                   "about 5x faster.",
}
"""What the demo says of the model it ran, measured by `quail bench --quality`."""


def run_demo(config: EngineConfig, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from quail import datasets

    out, err = out or sys.stdout, err or sys.stderr
    print("Quail demo: two AI filters and an AI join over 64 bundled movie reviews × 12 aspects.", file=out)
    print(f"Opening a session on {config.model} / {config.device} / {config.backend} "
          "(the first run converts the embedded model once).", file=err)
    with Session(config) as session:
        session.register("reviews", DocumentProvider.from_table(datasets.reviews(), "id"))
        session.register("aspects", DocumentProvider.from_table(datasets.aspects(), "id"))
        query = session.sql(DEMO_SQL)
        print(f"\n-- query --\n{DEMO_SQL}\n", file=out)
        print(f"-- plan --\n{query.explain()}\n", file=out)
        listener = progress_bar(err)
        session.registry.register_progress_listener(listener)
        try:
            result = query.run()
        finally:
            session.registry.unregister_progress_listener(listener)
        print(f"\n-- rows ({result.count()}) --\n{format_rows(result.collect())}\n", file=out)
        print(f"-- report --\n{format_report(result.report)}", file=out)
    print(f"\n{MODEL_NOTES.get(config.model, 'Answer quality per model: quail bench --quality.')}", file=out)
    return 0
