"""`quail bench --limits`: LIMIT queries run with the LIMIT met early and with today's whole-table plan, side by side.

Each workload runs twice in one process on the same model — `early_limit="auto"` and `early_limit="off"` (every
document read, as before) — with the answer store off, and the two must return the same rows. Printed and written
to limits.md: fresh tokens, wall and the share of documents the early plan read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

import quail
from quail import datasets

POSITIVE = "PROMPT('Is this movie review positive? {0}', r.body)"
ASPECT = "PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect)"
DOCUMENTS = 1000
JOIN_REVIEWS = 240


@dataclass(frozen=True)
class LimitWorkload:
    name: str
    sql: str


def workloads(documents: int, join_reviews: int) -> tuple[LimitWorkload, ...]:
    return (
        LimitWorkload(f"LIMIT 5 filter over {documents:,} reviews",
                      f"SELECT r.id FROM many r WHERE AI_FILTER({POSITIVE}) LIMIT 5"),
        LimitWorkload(f"LIMIT 10 join, {join_reviews} reviews × 12 aspects",
                      f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI_FILTER({ASPECT}) LIMIT 10"),
    )


@dataclass(frozen=True)
class Measured:
    rows: list[dict[str, object]]
    fresh_tokens: int
    wall_s: float
    explain: str
    selectivity: float | None
    """TRUE answers ÷ answers of the model nodes: over every document when the whole table was read."""


def many_reviews(count: int) -> pa.Table:
    """`count` distinct short reviews (up to 240 × 21): the first sentence of one labeled review, then the first
    sentence of another, the pair different for every document."""
    bodies = datasets.labeled_reviews().column("body").to_pylist()
    first = [b.split(". ")[0].rstrip(".") + "." for b in bodies]
    n = len(first)
    texts = [f"{first[i % n]} {first[(7 * (i % n) + 11 * (i // n + 1)) % n]}" for i in range(count)]
    return pa.table({"id": list(range(count)), "body": texts})


def run_limits(model: str, precision: str, out: Path, documents: int = DOCUMENTS,
               join_reviews: int = JOIN_REVIEWS) -> int:
    config = quail.EngineConfig(model=model, precision=precision, cache="off")  # type: ignore[arg-type]
    tables = {"many": many_reviews(documents),
              "reviews": datasets.labeled_reviews().select(["id", "body"]).slice(0, join_reviews),
              "aspects": datasets.aspects().select(["id", "aspect"])}
    lines = []
    for workload in workloads(documents, join_reviews):
        whole = measure(replace(config, early_limit="off"), workload, tables)
        early = measure(config, workload, tables)
        if early.rows != whole.rows:
            raise RuntimeError(f"{workload.name}: the early plan returned other rows than the whole one")
        read = next((line for line in early.explain.splitlines() if line.startswith("stopped after")), "read all")
        lines.append(f"{workload.name}: fresh tokens {early.fresh_tokens:,} vs {whole.fresh_tokens:,} "
                     f"({early.fresh_tokens / whole.fresh_tokens:.1%}); wall {early.wall_s:.2f} s vs "
                     f"{whole.wall_s:.2f} s ({whole.wall_s / early.wall_s:.1f}× faster); same {len(early.rows)} rows; "
                     f"{read}; selectivity over every document {whole.selectivity:.2f}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "limits.md").write_text("\n".join([f"# LIMIT met early ({model}, {precision}); each beside "
                                              "early_limit='off'", "", *(f"* {line}" for line in lines), ""]))
    for line in lines:
        print(line)
    return 0


def measure(config: quail.EngineConfig, workload: LimitWorkload, tables: dict[str, pa.Table]) -> Measured:
    with quail.Session(config) as session:
        for name, table in tables.items():
            session.register(name, table)
        query = session.sql(workload.sql)
        query.plan()  # tokenizing and planning are not what is compared
        started = time.perf_counter()
        result = query.run()
        wall = time.perf_counter() - started
        fresh = result.report["fresh_tokens"]
        answers = [value for table in result.answer_tables.values() if "answer" in table.column_names
                   for value in table.column("answer").to_pylist()]
        selectivity = sum(map(bool, answers)) / len(answers) if answers else None
        return Measured(result.to_rows(), fresh if isinstance(fresh, int) else 0, wall, result.explain(), selectivity)
