"""Does contextual calibration make a base model's answers better? Measured on the labeled reviews.

Runs three questions over `datasets.labeled_reviews()` with calibration on (so every raw margin and
every content-free threshold is measured in the same run), then scores both decision rules against
the labels: raw (TRUE iff margin > 0) and calibrated (TRUE iff margin > the content-free margin).
Accuracy, balanced accuracy (the aspect question is mostly FALSE) and AUC (ranking, which
calibration cannot change) per question. `python -m quail_native.benchmark.calibration`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

import quail
from quail import datasets

POSITIVE = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))"
NEGATIVE = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is this movie review negative? {0}', r.body))"
ASPECT = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
          "ON AI_FILTER(PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect))")


@dataclass(frozen=True)
class Scores:
    question: str
    examples: int
    true_share: float
    raw_accuracy: float
    calibrated_accuracy: float
    raw_balanced: float
    calibrated_balanced: float
    auc: float
    offset: float


def accuracy(labels: Sequence[bool], decisions: Sequence[bool]) -> float:
    return sum(a == b for a, b in zip(labels, decisions, strict=True)) / len(labels)


def balanced_accuracy(labels: Sequence[bool], decisions: Sequence[bool]) -> float:
    """Mean of the recall on TRUE and on FALSE examples: 0.5 for any constant answer."""
    recalls = []
    for side in (True, False):
        picked = [d for label, d in zip(labels, decisions, strict=True) if label == side]
        if picked:
            recalls.append(sum(d == side for d in picked) / len(picked))
    return sum(recalls) / len(recalls)


def auc(labels: Sequence[bool], margins: Sequence[float]) -> float:
    """P(a TRUE example's margin > a FALSE example's), ties counting half."""
    positives = [m for label, m in zip(labels, margins, strict=True) if label]
    negatives = [m for label, m in zip(labels, margins, strict=True) if not label]
    if not positives or not negatives:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def score(question: str, labels: Sequence[bool], margins: Sequence[float], offset: float) -> Scores:
    raw = [m > 0 for m in margins]
    calibrated = [m > offset for m in margins]
    return Scores(question, len(labels), sum(labels) / len(labels), accuracy(labels, raw),
                  accuracy(labels, calibrated), balanced_accuracy(labels, raw), balanced_accuracy(labels, calibrated),
                  auc(labels, margins), offset)


def run(sql: str, session: quail.Session) -> tuple[pa.Table, float]:
    """The model node's answer table and its calibration threshold."""
    result = session.sql(sql).run()
    [node] = [k for k in result.answer_tables if k.startswith(("filter_", "join_"))]
    [offset] = result.report["calibration"].values()
    return result.answer_tables[node], offset


def study(model: str, count: int) -> list[Scores]:
    table = datasets.labeled_reviews().slice(0, count)
    reviews = table.to_pylist()  # answer tables name documents by their row in the registered table
    with quail.Session(quail.EngineConfig(model=model, calibration="on")) as session:
        session.register("reviews", quail.DocumentProvider.from_table(table.select(["id", "body"]), "id"))
        session.register("aspects", quail.DocumentProvider.from_table(datasets.aspects().select(["id", "aspect"]),
                                                                      "id"))
        scores = []
        for question, sql, side in (("positive?", POSITIVE, "positive"), ("negative?", NEGATIVE, "negative")):
            answers, offset = run(sql, session)
            rows = [(reviews[i], m) for i, m in zip(answers.column("r").to_pylist(),
                                                    answers.column("margin").to_pylist(), strict=True)
                    if reviews[i]["sentiment"] != "mixed"]
            scores.append(score(f"{question} (mixed reviews left out)", [r["sentiment"] == side for r, _ in rows],
                                [m for _, m in rows], offset))
        answers, offset = run(ASPECT, session)
        aspects = datasets.aspects().column("aspect").to_pylist()
        labels = [reviews[r]["aspects"][aspects[a]] == "positive"
                  for r, a in zip(answers.column("r").to_pylist(), answers.column("a").to_pylist(), strict=True)]
        scores.append(score("speaks well of the <aspect>?", labels, answers.column("margin").to_pylist(), offset))
    return scores


def render(scores: Sequence[Scores], model: str, count: int) -> str:
    lines = [f"contextual calibration on {count} labeled reviews, model {model}",
             f"{'question':<44} {'n':>5} {'TRUE':>5} {'acc raw':>8} {'acc cal':>8} {'bal raw':>8} {'bal cal':>8} "
             f"{'AUC':>5} {'threshold':>9}"]
    for s in scores:
        lines.append(f"{s.question:<44} {s.examples:>5} {s.true_share:>5.2f} {s.raw_accuracy:>8.3f} "
                     f"{s.calibrated_accuracy:>8.3f} {s.raw_balanced:>8.3f} {s.calibrated_balanced:>8.3f} "
                     f"{s.auc:>5.3f} {s.offset:>+9.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=quail.EngineConfig().model)
    parser.add_argument("--reviews", type=int, default=240)
    parser.add_argument("--json", type=Path, help="also write the scores here")
    args = parser.parse_args(argv)
    scores = study(args.model, args.reviews)
    print(render(scores, args.model, args.reviews))
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in scores], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
