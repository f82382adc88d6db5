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
    print("\nThe embedded model is a 270M base model: it demonstrates the engine, not answer quality.", file=out)
    return 0
