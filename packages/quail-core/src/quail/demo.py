"""The main job: a two-filter + join query over the bundled movie reviews on the embedded model."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

import pyarrow as pa

from quail.config import EngineConfig
from quail.data.providers import DocumentProvider
from quail.physical.nodes import PhysicalNode
from quail.runtime.report import ReportValue
from quail.session import Session

DEMO_SQL = """\
SELECT r.id, r.title, a.aspect
FROM reviews r
JOIN aspects a
  ON AI_FILTER(PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect))
WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body), {'selectivity': 0.45})
  AND AI_FILTER(PROMPT('Would the reviewer recommend this movie to a friend? {0}', r.body),
                {'selectivity': 0.5})"""

REPORT_KEYS = ("backend", "model", "device", "wall_s", "boot_s", "boot_kind", "estimated_seconds", "sol_seconds",
               "fresh_tokens", "cached_tokens", "minimum_tokens", "order_rule")


def progress_bar(out: TextIO) -> Callable[[PhysicalNode, int, int], None]:
    """A tqdm bar per model node, fed by the backend's progress reports."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def update(node: PhysicalNode, done: int, total: int) -> None:
        bar = bars.get(node.id)
        if bar is None:
            bar = bars[node.id] = tqdm(total=total, desc=node.describe()[:48], unit="item", file=out, leave=True)
        bar.total = total
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()

    return update


def format_rows(table: pa.Table, limit: int = 30) -> str:
    rows = table.slice(0, limit).to_pylist()
    if not rows:
        return "(no rows)"
    names = table.column_names
    cells = [[str(row[n])[:60] for n in names] for row in rows]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    if table.num_rows > limit:
        lines.append(f"... {table.num_rows - limit} more rows")
    return "\n".join(lines)


def format_report(report: dict[str, ReportValue]) -> str:
    lines = [f"  {key}: {report[key]}" for key in REPORT_KEYS]
    fresh, minimum = report["fresh_tokens"], report["minimum_tokens"]
    if isinstance(fresh, int) and isinstance(minimum, int) and minimum:
        lines.append(f"  fresh / minimum tokens: {fresh / minimum:.3f}")
    answers = report.get("answers")
    if isinstance(answers, dict):
        lines.append(f"  answers: {answers['stored']} stored, {answers['computed']} computed, "
                     f"{answers['duplicates']} copied from identical prompts")
    stages = report["stages"]
    if isinstance(stages, list):
        for stage in stages:
            if isinstance(stage, dict):
                lines.append(f"  stage #{stage['position']} ({stage['node']}): evaluated {stage['evaluated']}, "
                             f"observed selectivity {stage['observed_selectivity']}, "
                             f"provided {stage['provided_selectivity']}")
    return "\n".join(lines)


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
