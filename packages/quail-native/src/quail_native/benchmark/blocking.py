"""`quail bench --blocking`: AI joins with and without similarity blocking, side by side in one process.

Each join runs twice on the same model with the answer store off — every pair asked, then only the pairs the
embeddings keep (`{'blocking': 'top_k', 'k': …}`) — and is printed and written to blocking.md / blocking.json:
model calls (the join's pairs the model answered), wall, the rows, and the recall of the unblocked answer (its rows
the blocked join also returns) beside the recall the blocked run estimated from its sample. The bundled joins
(claims × evidence, reviews × aspects) and a large one (`--pairs`, 1,000 × 100 by default: review sentences × other
review sentences).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

import quail
from quail.extend import datasets
from quail_native.benchmark.limits import many_reviews, review_sentences


@dataclass(frozen=True)
class BlockingWorkload:
    name: str
    sql: str
    """The join, with `{options}` where the blocking options go."""
    k: int


@dataclass(frozen=True)
class Run:
    rows: int
    calls: int
    wall_s: float
    estimated_recall: float | None
    sampled: int


@dataclass(frozen=True)
class Compared:
    name: str
    pairs: int
    unblocked: Run
    blocked: Run
    recall: float | None
    """Rows of the unblocked answer the blocked join returns too, ÷ rows of the unblocked answer."""
    k: int

    @property
    def fewer_calls(self) -> float:
        return self.unblocked.calls / max(self.blocked.calls + self.blocked.sampled, 1)

    def line(self) -> str:
        recall = "no row to recall" if self.recall is None else f"recall {self.recall:.3f} of the unblocked answer"
        estimate = "" if self.blocked.estimated_recall is None else (
            f" (estimated {self.blocked.estimated_recall:.3f} from {self.blocked.sampled} sampled pairs)")
        return (f"{self.name} ({self.pairs:,} pairs, k {self.k}): model calls {self.unblocked.calls:,} → "
                f"{self.blocked.calls:,} + {self.blocked.sampled} sampled ({self.fewer_calls:.1f}× fewer); wall "
                f"{self.unblocked.wall_s:.1f} s → {self.blocked.wall_s:.1f} s; rows {self.unblocked.rows:,} → "
                f"{self.blocked.rows:,}; {recall}{estimate}")


CLAIMS = ("SELECT c.id AS claim, e.id AS passage FROM claims c JOIN evidence e ON AI_FILTER(PROMPT('Is the passage "
          "{1} about the same product or company as the claim {0}?', c.text, e.passage){options})")
ASPECTS = ("SELECT r.id AS review, a.id AS aspect FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('Does the "
           "review {0} discuss the {1}?', r.body, a.aspect){options})")
SENTENCES = ("SELECT x.id AS a, y.id AS b FROM many x JOIN few y ON AI_FILTER(PROMPT('Do the review sentences {0} "
             "and {1} praise or criticise the same aspect of a film?', x.body, y.body){options})")


def workloads(left: int, right: int) -> tuple[BlockingWorkload, ...]:
    return (
        BlockingWorkload("claims × evidence", CLAIMS, 4),
        BlockingWorkload("reviews × aspects", ASPECTS, 3),
        BlockingWorkload("reviews × review sentences", SENTENCES, max(right // 10, 1)),
    )


MAX_LEFT, MAX_RIGHT = 5040, 1066
"""The large join's sides: two-sentence reviews (`many_reviews`) × single review sentences (`review_sentences`)."""


def tables(left: int, right: int) -> dict[str, pa.Table]:
    if not (1 <= left <= MAX_LEFT and 1 <= right <= MAX_RIGHT):
        raise quail.RefusalError(quail.Refusal(f"--pairs {left}x{right} is out of range",
                                               (f"the large join takes 1–{MAX_LEFT} × 1–{MAX_RIGHT} texts",)))
    return {"claims": datasets.claims().select(["id", "text"]),
            "evidence": datasets.evidence().select(["id", "passage"]),
            "reviews": datasets.reviews().select(["id", "body"]),
            "aspects": datasets.aspects().select(["id", "aspect"]),
            "many": many_reviews(left), "few": review_sentences(right)}


def run_blocking(model: str, precision: str, out: Path, left: int = 1000, right: int = 100,
                 only: list[str] | None = None) -> int:
    """Every workload (or those whose names contain one of `only`), unblocked then blocked."""
    config = quail.EngineConfig(model=model, precision=precision, cache="off")  # type: ignore[arg-type]
    data = tables(left, right)
    results = []
    for workload in [w for w in workloads(left, right) if not only or any(part in w.name for part in only)]:
        unblocked, unblocked_rows = measure(config, workload.sql.replace("{options}", ""), data)
        options = f", {{'blocking': 'top_k', 'k': {workload.k}}}"
        blocked, blocked_rows = measure(config, workload.sql.replace("{options}", options), data)
        recall = len(unblocked_rows & blocked_rows) / len(unblocked_rows) if unblocked_rows else None
        sizes = [data[t].num_rows for t in _tables_of(workload.sql)]
        compared = Compared(workload.name, sizes[0] * sizes[1], unblocked, blocked, recall, workload.k)
        results.append(compared)
        print(compared.line(), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Similarity blocking ({model}, {precision}); each join beside itself unblocked", "",
             *(f"* {c.line()}" for c in results), ""]
    (out / "blocking.md").write_text("\n".join(lines))
    (out / "blocking.json").write_text(json.dumps([{**asdict(c), "fewer_calls": c.fewer_calls} for c in results],
                                                  indent=2))
    return 0


def _tables_of(sql: str) -> list[str]:
    words = sql.split()
    return [words[i + 1] for i, word in enumerate(words) if word in ("FROM", "JOIN")]


def measure(config: quail.EngineConfig, sql: str, data: dict[str, pa.Table]) -> tuple[Run, set[tuple[object, ...]]]:
    with quail.Session(config) as session:
        for name, table in data.items():
            session.register(name, table)
        query = session.sql(sql)
        started = time.perf_counter()
        result = query.run()
        wall = time.perf_counter() - started
        calls = sum(m.computed_answers or 0 for name, m in result.query_report.node_metrics.items()
                    if name.startswith("join"))
        blocking = result.query_report.blocking
        rows = {tuple(row.values()) for row in result.to_rows()}
        run = Run(len(rows), calls, wall, None if blocking is None else blocking.estimated_recall,
                  0 if blocking is None else blocking.sampled)
        return run, rows
