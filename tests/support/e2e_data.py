"""Small realistic tables for the end-to-end tests, and a plain-Python oracle for query semantics.

The oracle knows nothing of the engine: it loops over the Python rows, asks the keyword rule of
`quail.testing.rules` for each item's margin, and applies relational semantics by hand. Ids are
deliberately not 0..n-1, so a result that confuses row positions with ids is caught.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from quail.testing.rules import classify_margins, predicate_margin

# -- the tables ---------------------------------------------------------------------------------

REVIEWS: dict[str, list[Any]] = {
    "id": [101, 105, 109, 113, 117, 121, 125, 129, 133, 137, 141, 145, 149, 153, 157, 161],
    "title": [
        "Quiet Harbor", "Night Songs", "Lost Summer", "Glass City", "Double Cross", "Grey Days",
        "Paper Crowns", "Drumline", "Starfall", "Last Letter", "Noise", "The Heist", "Northern Light",
        "Balloon Days", "Cold Case", "Fragments",
    ],
    "body": [
        "Brilliant acting from the whole cast, though the plot drags in the middle.",
        "The soundtrack is gorgeous and the music carries every scene.",
        "Boring plot, wooden dialogue, and an ending nobody asked for.",
        "I loved the visual effects; the acting felt flat.",
        "Pacing is tight and the plot twists land perfectly.",
        "A forgettable film with nothing to say.",
        "The dialogue sparkles and the acting is superb, a must see.",
        "Music cues were overbearing and the pacing dragged.",
        "Stunning visual effects but a hollow story.",
        "The ending made me cry; superb acting and soundtrack.",
        "Too long, too loud, too dull.",
        "Clever plot twists and sharp dialogue throughout.",
        "The cinematography is lovely, yet the ending falls apart.",
        "Great fun for families, with catchy music and bright colors.",
        "Weak acting and a predictable plot.",
        "An experimental piece; pacing and visuals are unusual.",
    ],
    "stars": [4, 5, 1, 3, 5, 2, 5, 2, 3, 5, 1, 4, 3, 4, 2, 3],
}

ASPECTS: dict[str, list[Any]] = {
    "aspect_id": [11, 14, 17, 20, 23, 26, 29],
    "aspect": ["acting", "plot twists", "soundtrack music", "pacing", "dialogue", "ending", "visual effects"],
}

GENRES: dict[str, list[Any]] = {
    "genre_id": [7, 8, 9],
    "name": ["musical", "thriller", "drama"],
    "description": ["musical: songs, soundtrack, music", "thriller: suspense, plot twists, pacing",
                    "drama: acting, emotion, dialogue"],
}

CLAIMS: dict[str, list[Any]] = {
    "claim_id": [201, 203, 205, 207, 209, 211, 213, 215, 217],
    "text": [
        "Coffee improves memory in older adults.",
        "Regular exercise lowers blood pressure.",
        "Electric cars produce zero emissions over their lifetime.",
        "Solar panels pay for themselves within ten years.",
        "Reading fiction increases empathy.",
        "Coffee causes dehydration.",
        "Remote work boosts productivity.",
        "Exercise improves sleep quality.",
        "Chocolate cures colds.",
    ],
    "url": [
        "https://health.example/coffee", "https://health.example/exercise", "https://energy.example/ev",
        "https://energy.example/solar", "https://culture.example/fiction", "https://health.example/coffee",
        "https://work.example/remote", "https://health.example/exercise", "https://health.example/chocolate",
    ],
}

EVIDENCE: dict[str, list[Any]] = {
    "evidence_id": [301, 302, 303, 304, 305, 306, 307, 308, 309, 310],
    "passage": [
        "A trial of older adults found coffee drinkers recalled more words.",
        "Caffeine has a mild diuretic effect that does not cause dehydration in habitual drinkers.",
        "Aerobic exercise reduced systolic blood pressure by five points in a peer reviewed trial.",
        "Participants who walked daily reported deeper sleep.",
        "Lifecycle analyses show electric cars still emit during battery production.",
        "Battery recycling programs are expanding in Europe.",
        "Payback periods for rooftop solar range from six to twelve years, a peer reviewed survey says.",
        "Literary fiction readers scored higher on empathy tests.",
        "Survey of remote employees shows mixed productivity results.",
        "Office attendance rose after new hiring policies.",
    ],
    "source": [
        "https://health.example/coffee", "https://health.example/coffee", "https://health.example/exercise",
        "https://health.example/exercise", "https://energy.example/ev", "https://energy.example/ev",
        "https://energy.example/solar", "https://culture.example/fiction", "https://work.example/remote",
        "https://work.example/office",
    ],
}

TABLES: dict[str, tuple[dict[str, list[Any]], str]] = {
    "reviews": (REVIEWS, "id"),
    "aspects": (ASPECTS, "aspect_id"),
    "genres": (GENRES, "genre_id"),
    "claims": (CLAIMS, "claim_id"),
    "evidence": (EVIDENCE, "evidence_id"),
}


def arrow_table(name: str) -> pa.Table:
    columns, _ = TABLES[name]
    return pa.table(columns)


def rows_of(name: str) -> list[dict[str, Any]]:
    columns, _ = TABLES[name]
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


# -- the oracle's description of a query ---------------------------------------------------------


@dataclass(frozen=True)
class Pred:
    """An AI predicate: template, `alias.column` per placeholder, optional AI.SCORE threshold."""

    template: str
    refs: tuple[str, ...]
    threshold: tuple[str, float] | None = None


@dataclass(frozen=True)
class Sub:
    """[NOT] EXISTS (SELECT 1 FROM table alias WHERE <pred> AND <filters> AND <equalities>)."""

    alias: str
    table: str
    pred: Pred
    filters: tuple[Pred, ...] = ()
    equalities: tuple[tuple[str, str], ...] = ()
    anti: bool = False


@dataclass(frozen=True)
class Classify:
    ref: str
    labels: tuple[str, ...]
    output: str
    allowed: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ScoreOut:
    pred: Pred
    output: str


@dataclass(frozen=True)
class OracleQuery:
    tables: tuple[tuple[str, str], ...]  # (alias, table) in FROM order
    select: tuple[str, ...]  # "alias.column", "alias.*", "*", or an AI output name
    preds: tuple[Pred, ...] = ()  # filters and full-join predicates alike
    equalities: tuple[tuple[str, str], ...] = ()  # ("c.url", "e.source")
    subqueries: tuple[Sub, ...] = ()
    classifies: tuple[Classify, ...] = ()
    scores: tuple[ScoreOut, ...] = ()
    limit: int | None = None


def sigmoid(margin: float) -> float:
    return 1.0 / (1.0 + math.exp(-margin))


def compare(op: str, left: float, right: float) -> bool:
    return {">=": left >= right, ">": left > right, "<=": left <= right, "<": left < right}[op]


def _value(binding: Mapping[str, Mapping[str, Any]], ref: str) -> Any:
    alias, column = ref.split(".")
    return binding[alias][column]


def holds(pred: Pred, binding: Mapping[str, Mapping[str, Any]]) -> bool:
    """One item's answer: TRUE iff the margin is positive, or the score compares as asked."""
    margin = predicate_margin(pred.template, [_value(binding, ref) for ref in pred.refs])
    if pred.threshold is None:
        return margin > 0
    op, value = pred.threshold
    return compare(op, sigmoid(margin), value)


def choose_label(labels: Sequence[str], document: str) -> str:
    margins = classify_margins(list(labels), document)
    best = 0
    for index, value in enumerate(margins):
        if value > margins[best]:
            best = index
    return labels[best]


def output_columns(query: OracleQuery) -> list[str]:
    names: list[str] = []
    outputs = {c.output for c in query.classifies} | {s.output for s in query.scores}
    for item in query.select:
        if item == "*":
            for alias, table in query.tables:
                names.extend(f"{alias}.{c}" for c in TABLES[table][0])
        elif item.endswith(".*"):
            alias = item[:-2]
            table = dict(query.tables)[alias]
            names.extend(f"{alias}.{c}" for c in TABLES[table][0])
        elif item in outputs:
            names.append(item)
        else:
            names.append(item)
    return names


def evaluate(query: OracleQuery) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, every result row) of the query without its LIMIT — nested loops, by hand."""
    aliases = [alias for alias, _ in query.tables]
    tables = [rows_of(table) for _, table in query.tables]
    kept: list[dict[str, Any]] = []
    for combo in itertools.product(*tables):
        binding: dict[str, Any] = dict(zip(aliases, combo, strict=True))
        if not all(_value(binding, a) == _value(binding, b) for a, b in query.equalities):
            continue
        if not all(holds(p, binding) for p in query.preds):
            continue
        if not all(_subquery_holds(s, binding) for s in query.subqueries):
            continue
        outputs: dict[str, Any] = {}
        for item in query.classifies:
            outputs[item.output] = choose_label(item.labels, _value(binding, item.ref))
        if any(c.allowed is not None and outputs[c.output] not in c.allowed for c in query.classifies):
            continue
        for score in query.scores:
            margin = predicate_margin(score.pred.template, [_value(binding, r) for r in score.pred.refs])
            outputs[score.output] = sigmoid(margin)
        binding["__outputs"] = outputs
        kept.append(binding)
    references = output_columns(query)
    rows = []
    for binding in kept:
        row = []
        for name in references:
            row.append(binding["__outputs"][name] if "." not in name else _value(binding, name))
        rows.append(tuple(row))
    return [result_name(n) for n in references], rows


def result_name(reference: str) -> str:
    """`r.id` is named `id` in a result, as DuckDB, BigQuery and Snowflake name it; an AI output keeps its name."""
    return reference.split(".", 1)[1] if "." in reference else reference


def _subquery_holds(sub: Sub, outer: Mapping[str, Any]) -> bool:
    found = False
    for inner in rows_of(sub.table):
        binding = {**outer, sub.alias: inner}
        if not all(_value(binding, a) == _value(binding, b) for a, b in sub.equalities):
            continue
        if not all(holds(p, binding) for p in sub.filters):
            continue
        if holds(sub.pred, binding):
            found = True
            break
    return not found if sub.anti else found


def normalized(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """A multiset of rows as a sorted list; floats rounded so sigmoid rounding never matters."""
    def cell(value: Any) -> Any:
        return round(value, 9) if isinstance(value, float) else value

    return sorted(tuple(cell(v) for v in row) for row in rows)
