"""The benchmark's queries: reviews × aspects, claims × evidence, cumulative traces."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from quail.extend import datasets

POSITIVE = "PROMPT('Is this movie review positive? {0}', r.body)"
RECOMMEND = "PROMPT('Would the reviewer recommend this movie to a friend? {0}', r.body)"
FUNNY = "PROMPT('Does this review say the movie is funny? {0}', r.body)"
ASPECT = "PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect)"
MENTION = "PROMPT('Does the review {0} mention the {1}?', r.body, m.aspect)"


@dataclass(frozen=True)
class Workload:
    name: str
    sql: str
    tables: tuple[str, ...]


@dataclass(frozen=True)
class Scale:
    reviews: int
    aspects: int
    claims: int
    evidence: int
    traces: int


SCALES = {
    "tiny": Scale(reviews=3, aspects=2, claims=4, evidence=12, traces=4),
    "small": Scale(reviews=16, aspects=12, claims=24, evidence=60, traces=16),
    "medium": Scale(reviews=40, aspects=12, claims=24, evidence=60, traces=24),
    "large": Scale(reviews=64, aspects=12, claims=24, evidence=60, traces=32),
    "xlarge": Scale(reviews=240, aspects=12, claims=24, evidence=60, traces=32),
}
"""Up to 64 reviews come from `datasets.reviews()`; more (xlarge) from the 240 `datasets.labeled_reviews()`."""


def tables(scale: str) -> dict[str, Callable[[], pa.Table]]:
    size = SCALES[scale]
    return {
        "reviews": lambda: _reviews(size.reviews),
        "aspects": lambda: datasets.aspects().slice(0, size.aspects),
        "claims": lambda: datasets.claims().slice(0, size.claims),
        "evidence": lambda: datasets.evidence().slice(0, size.evidence),
        "traces": lambda: datasets.traces().slice(0, size.traces),
    }


def _reviews(count: int) -> pa.Table:
    source = datasets.reviews() if count <= 64 else datasets.labeled_reviews()
    return source.slice(0, count).select(["id", "title", "body", "stars"])


def selected(patterns: str | None) -> tuple[Workload, ...]:
    """The workloads whose names contain one of the comma-separated patterns (all when None)."""
    if not patterns:
        return WORKLOADS
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen = tuple(w for w in WORKLOADS if any(p in w.name for p in wanted))
    if not chosen:
        raise ValueError(f"no workload matches {patterns!r}; workloads: {', '.join(w.name for w in WORKLOADS)}")
    return chosen


WORKLOADS: tuple[Workload, ...] = (
    Workload("reviews: 1 filter", f"SELECT r.id FROM reviews r WHERE AI_FILTER({POSITIVE})", ("reviews",)),
    Workload("reviews: 2 filters",
             f"SELECT r.id FROM reviews r WHERE AI_FILTER({POSITIVE}) AND AI_FILTER({RECOMMEND})", ("reviews",)),
    Workload("reviews: 3 filters",
             f"SELECT r.id FROM reviews r WHERE AI_FILTER({POSITIVE}) AND AI_FILTER({RECOMMEND}) "
             f"AND AI_FILTER({FUNNY})", ("reviews",)),
    Workload("reviews: filter → join",
             f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI_FILTER({ASPECT}) "
             f"WHERE AI_FILTER({POSITIVE})", ("reviews", "aspects")),
    Workload("reviews: 2 filters → join",
             f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI_FILTER({ASPECT}) "
             f"WHERE AI_FILTER({POSITIVE}) AND AI_FILTER({RECOMMEND})", ("reviews", "aspects")),
    Workload("reviews: two joins sharing an anchor",
             f"SELECT r.id, a.aspect, m.aspect FROM reviews r JOIN aspects a ON AI_FILTER({ASPECT}, {{'anchor': 'r'}}) "
             f"JOIN aspects m ON AI_FILTER({MENTION}, {{'anchor': 'r'}})", ("reviews", "aspects")),
    Workload("reviews: column pre-filter → filter → GROUP BY",
             f"SELECT r.stars, COUNT(*) AS n FROM reviews r WHERE r.stars >= 3 AND AI_FILTER({POSITIVE}) "
             "GROUP BY r.stars ORDER BY r.stars", ("reviews",)),
    Workload("reviews: classification",
             "SELECT r.id, AI_CLASSIFY(r.body, ['positive', 'negative', 'mixed']) AS sentiment FROM reviews r",
             ("reviews",)),
    Workload("claims × evidence: filters both sides → equality join",
             "SELECT c.id, e.id FROM claims c JOIN evidence e ON c.url = e.source AND "
             "AI_FILTER(PROMPT('Does the passage {1} support the claim {0}?', c.text, e.passage)) "
             "WHERE AI_FILTER(PROMPT('Is this claim about a company? {0}', c.text)) "
             "AND AI_FILTER(PROMPT('Is this passage written in a neutral tone? {0}', e.passage))",
             ("claims", "evidence")),
    Workload("traces: filter over cumulative agent traces",
             "SELECT t.id FROM traces t WHERE AI_FILTER(PROMPT('Did the agent hit an error? {0}', t.log))",
             ("traces",)),
)
