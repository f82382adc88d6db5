"""`quail bench --quality`: how good the answers are, per model, on the bundled labeled reviews.

Four questions over `datasets.labeled_reviews()` (hand-written, with sentiment and per-aspect labels), each
asked as one `AI_FILTER` query with calibration on, so every raw margin and every content-free threshold comes
from the same run; then asked again with four demonstrations (two TRUE, two FALSE, the shortest fitting reviews
of `datasets.reviews()`, which the labeled set does not contain) in the filter's `examples` option. A fifth
question is a join: 40 reviews × 12 aspects. Scored against the labels: AUC (ranking, which calibration cannot
change), accuracy and balanced accuracy of the raw decision (TRUE iff margin > 0) and of the calibrated one
(TRUE iff margin > the content-free margin).

Each model runs in a process of its own, one after the other, so its peak memory is its own.
`python -m quail_native.benchmark.quality --model NAME` runs one model and prints its table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import quail
from quail.extend import datasets

Review = dict[str, object]


@dataclass(frozen=True)
class Question:
    text: str
    holds: Callable[[Review], bool]
    counts: Callable[[Review], bool]
    """Which reviews the question is scored on (mixed reviews have no clear answer to 'positive?')."""
    note: str = ""


def _aspect(review: Review, name: str) -> str:
    aspects = review["aspects"]
    assert isinstance(aspects, dict)
    return str(aspects[name])


QUESTIONS = (
    Question("Is this movie review positive?", lambda r: r["sentiment"] == "positive",
             lambda r: r["sentiment"] != "mixed", "mixed reviews left out"),
    Question("Does the review discuss the acting?", lambda r: _aspect(r, "acting") != "none", lambda r: True),
    Question("Does the review praise the acting?", lambda r: _aspect(r, "acting") == "positive", lambda r: True),
    Question("Does the review discuss the ending?", lambda r: _aspect(r, "ending") != "none", lambda r: True),
)
SHOTS = 2
"""Demonstrations per side (TRUE and FALSE) when a question is asked with examples."""
JOIN = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
        "ON AI_FILTER(PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect))")
JOIN_QUESTION = "Does the review speak well of the <aspect>? (join, 12 aspects)"
JOIN_REVIEWS = 40
"""Reviews the join question pairs with every aspect (examples are for one-document prompts: none here)."""


@dataclass(frozen=True)
class Scores:
    model: str
    question: str
    examples: int
    """Demonstrations given in the query (0: none)."""
    documents: int
    true_share: float
    auc: float
    raw_accuracy: float
    calibrated_accuracy: float
    raw_balanced: float
    calibrated_balanced: float
    threshold: float
    wall_s: float


@dataclass(frozen=True)
class ModelQuality:
    model: str
    scores: tuple[Scores, ...]
    peak_rss_bytes: int
    wall_s: float


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


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def auc(labels: Sequence[bool], margins: Sequence[float]) -> float:
    """P(a TRUE example's margin > a FALSE example's), ties counting half."""
    positives = [m for label, m in zip(labels, margins, strict=True) if label]
    negatives = [m for label, m in zip(labels, margins, strict=True) if not label]
    if not positives or not negatives:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def demonstrations(question: Question, per_side: int = SHOTS) -> list[tuple[str, bool]]:
    """The shortest reviews of `datasets.reviews()` the question holds for and does not, alternating."""
    pool = sorted((r for r in datasets.reviews().to_pylist() if question.counts(r)), key=lambda r: len(str(r["body"])))
    sides = [[r for r in pool if question.holds(r) == side][:per_side] for side in (True, False)]
    return [(str(r["body"]), side) for pair in zip(*sides, strict=True) for r, side in zip(pair, (True, False),
                                                                                           strict=True)]


def query(question: Question, examples: Sequence[tuple[str, bool]]) -> str:
    template = question.text.replace("'", "''") + " {0}"
    if not examples:
        return f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{template}', r.body))"
    shots = ", ".join(f"('{text.replace(chr(39), chr(39) * 2)}', {'TRUE' if answer else 'FALSE'})"
                      for text, answer in examples)
    return f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{template}', r.body), {{'examples': [{shots}]}})"


def score(model: str, question: Question, examples: int, reviews: Sequence[Review], result: quail.QueryResult,
          wall_s: float) -> Scores:
    answers = result.answer_tables["filter_r"]
    [threshold] = result.report["calibration"].values()
    pairs = [(reviews[row], margin) for row, margin in zip(answers.column("r").to_pylist(),
                                                          answers.column("margin").to_pylist(), strict=True)
             if question.counts(reviews[row])]
    name = f"{question.text} ({question.note})" if question.note else question.text
    return scored(model, name, examples, [question.holds(review) for review, _ in pairs],
                  [margin for _, margin in pairs], threshold, wall_s)


def scored(model: str, name: str, examples: int, labels: Sequence[bool], margins: Sequence[float], threshold: float,
           wall_s: float) -> Scores:
    raw, calibrated = [m > 0 for m in margins], [m > threshold for m in margins]
    return Scores(model, name, examples, len(labels), sum(labels) / len(labels), auc(labels, margins),
                  accuracy(labels, raw), accuracy(labels, calibrated), balanced_accuracy(labels, raw),
                  balanced_accuracy(labels, calibrated), threshold, wall_s)


def join_scores(model: str, session: quail.Session, reviews: Sequence[Review]) -> Scores:
    """The join question over the first JOIN_REVIEWS reviews × every aspect: TRUE where the review's label for the
    aspect is positive."""
    aspects = datasets.aspects().column("aspect").to_pylist()
    started = time.perf_counter()
    result = session.sql(JOIN.replace("FROM reviews r", "FROM joined_reviews r")).run()
    answers = result.answer_tables["join_0"]
    [threshold] = result.report["calibration"].values()
    labels = [_aspect(reviews[r], aspects[a]) == "positive"
              for r, a in zip(answers.column("r").to_pylist(), answers.column("a").to_pylist(), strict=True)]
    return scored(model, JOIN_QUESTION, 0, labels, answers.column("margin").to_pylist(), threshold,
                  time.perf_counter() - started)


def study(model: str, count: int, precision: str = "auto") -> list[Scores]:
    """Every question with and without demonstrations on `count` labeled reviews, in this process."""
    table = datasets.labeled_reviews().slice(0, count)
    reviews = table.to_pylist()  # answer tables name documents by their row in the registered table
    config = quail.EngineConfig(model=model, calibration="on", precision=precision)
    scores = []
    with quail.Session(config) as session:
        session.register("reviews", quail.DocumentProvider.from_table(table.select(["id", "body"]), "id"))
        for question in QUESTIONS:
            for examples in ([], demonstrations(question)):
                started = time.perf_counter()
                result = session.sql(query(question, examples)).run()
                scores.append(score(model, question, len(examples), reviews, result,
                                    time.perf_counter() - started))
        joined = table.slice(0, JOIN_REVIEWS)
        session.register("joined_reviews", quail.DocumentProvider.from_table(joined.select(["id", "body"]), "id"))
        session.register("aspects", quail.DocumentProvider.from_table(datasets.aspects().select(["id", "aspect"]),
                                                                      "id"))
        scores.append(join_scores(model, session, joined.to_pylist()))
    return scores


def measure(model: str, count: int, precision: str = "auto") -> ModelQuality:
    """`study` in a child process: the child's peak resident memory is this model's."""
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", __name__, "--model", model, "--reviews", str(count),
                                "--precision", precision, "--emit-json"],
                               capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"the quality run of {model} failed:\n{completed.stderr[-3000:]}")
    payload = json.loads(completed.stdout.strip().splitlines()[-1])
    return ModelQuality(model, tuple(Scores(**s) for s in payload["scores"]), int(payload["peak_rss_bytes"]),
                        time.perf_counter() - started)


def render(runs: Sequence[ModelQuality], count: int) -> str:
    """A markdown table per model, then one summary line per model and setting."""
    lines = [f"Answer quality on the first {count} of `quail.datasets.labeled_reviews()` "
             f"(calibration measured in the same runs; 'shots' = demonstrations in the query)", ""]
    lines += ["| model | question | shots | n | TRUE share | AUC | accuracy raw | accuracy calibrated | "
              "balanced raw | balanced calibrated |", "|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for s in run.scores:
            lines.append(f"| {s.model} | {s.question} | {s.examples} | {s.documents} | {s.true_share:.2f} | "
                         f"{s.auc:.3f} | {s.raw_accuracy:.3f} | {s.calibrated_accuracy:.3f} | {s.raw_balanced:.3f} | "
                         f"{s.calibrated_balanced:.3f} |")
    lines += ["", "Means over the four filter questions:", "",
              "| model | shots | mean AUC | mean accuracy raw | mean accuracy calibrated | mean balanced raw | "
                  "mean balanced calibrated | peak memory | wall |", "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        filters = [s for s in run.scores if s.question != JOIN_QUESTION]
        for shots in sorted({s.examples for s in filters}):
            picked = [s for s in filters if s.examples == shots]
            wall = sum(s.wall_s for s in picked)
            lines.append(f"| {run.model} | {shots} | {mean([s.auc for s in picked]):.3f} | "
                         f"{mean([s.raw_accuracy for s in picked]):.3f} | "
                         f"{mean([s.calibrated_accuracy for s in picked]):.3f} | "
                         f"{mean([s.raw_balanced for s in picked]):.3f} | "
                         f"{mean([s.calibrated_balanced for s in picked]):.3f} | "
                         f"{run.peak_rss_bytes / 2**30:.2f} GiB | {wall:.0f} s |")
    return "\n".join(lines)


def run_quality(models: Sequence[str], count: int, out: Path, precision: str = "auto") -> int:
    """Every model in turn; the tables printed and written to `out` (quality.md, quality.json)."""
    runs = []
    for model in models:
        print(f"quality: {model} on {count} reviews …", file=sys.stderr, flush=True)
        runs.append(measure(model, count, precision))
    text = render(runs, count)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.md").write_text(text + "\n")
    (out / "quality.json").write_text(json.dumps([asdict(run) for run in runs], indent=2) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=quail.EngineConfig().model)
    parser.add_argument("--reviews", type=int, default=120)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--emit-json", action="store_true", help="print one JSON line (for the parent process)")
    args = parser.parse_args(argv)
    scores = study(args.model, args.reviews, args.precision)
    if args.emit_json:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
        print(json.dumps({"scores": [asdict(s) for s in scores], "peak_rss_bytes": peak}))
    else:
        print(render([ModelQuality(args.model, tuple(scores), 0, 0.0)], args.reviews))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
