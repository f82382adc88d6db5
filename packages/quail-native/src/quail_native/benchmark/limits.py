"""`quail bench --limits`: the queries whose model work the plan spares, each beside the plan without that saving.

Each workload runs twice in one process on the same model — with the saving and with its switch off: a LIMIT met
early (`early_limit`), a condition between joined tables restricting the pairs (`join_conditions`), a long question
stated once (`question_first`) — with the answer store off; the two must return the same rows. Printed and written
to limits.md: fresh tokens, wall, and for a LIMIT the share of documents read.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import pyarrow as pa

import quail
from quail.extend import datasets

POSITIVE = "PROMPT('Is this movie review positive? {0}', r.body)"
ASPECT = "PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect)"
DOCUMENTS = 1000
JOIN_REVIEWS = 240


RUBRIC = ("Rate the review {0} against this rubric. A strong review names the director, describes the acting "
          "with a concrete example, discusses the plot without spoilers, mentions the cinematography or the music, "
          "compares the film to others of its genre, and ends with a clear recommendation for a specific audience. "
          "It also weighs the pacing of the second half, notes how the editing serves the story, says whether the "
          "dialogue sounds natural, judges the costumes and the production design, and gives a reason for every "
          "opinion rather than a bare verdict. A strong review also places the film in the career of its director, "
          "and it warns the reader about its length. Does the review meet the rubric well?")


Switch = Literal["early_limit", "join_conditions", "question_first"]
"""The EngineConfig fields that turn one saving off."""


@dataclass(frozen=True)
class LimitWorkload:
    name: str
    sql: str
    switch: Switch = "early_limit"
    """The EngineConfig switch that turns the saving off for the side-by-side run."""
    same_answers: bool = True
    """False where the saving changes the prompt's words (a question stated first): the same rows, other scores."""


def workloads(documents: int, join_reviews: int) -> tuple[LimitWorkload, ...]:
    return (
        LimitWorkload(f"LIMIT 5 filter over {documents:,} reviews",
                      f"SELECT r.id FROM many r WHERE AI_FILTER({POSITIVE}) LIMIT 5"),
        LimitWorkload(f"LIMIT 10 join, {join_reviews} reviews × 12 aspects",
                      f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI_FILTER({ASPECT}) LIMIT 10"),
        LimitWorkload(f"self-join with an inequality, {max(join_reviews // 4, 12)} reviews of 6 movies",
                      "SELECT r1.id AS a, r2.id AS b FROM films r1 JOIN films r2 ON r1.movie = r2.movie "
                      "AND r1.id < r2.id WHERE AI_FILTER(PROMPT('Do the reviews {0} and {1} express the same "
                      "sentiment?', r1.body, r2.body)) ORDER BY a, b", "join_conditions"),
        LimitWorkload(f"a {len(RUBRIC.split())}-word rubric AI.SCORE over {documents:,} one-sentence reviews",
                      f"SELECT r.id, AI.SCORE(PROMPT('{RUBRIC}', r.body)) AS s FROM sentences r ORDER BY r.id",
                      "question_first", same_answers=False),
    )


@dataclass(frozen=True)
class Measured:
    rows: list[dict[str, object]]
    fresh_tokens: int
    minimum_tokens: int
    """What a perfect executor computes for the same answers: each distinct prompt prefix once."""
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


def review_sentences(count: int) -> pa.Table:
    """Up to 1,066 short documents, each one sentence of a labeled review (all distinct): `many_reviews` builds
    its documents from 240 first sentences, so ~4 of them start alike — prefixes a score node does not borrow,
    which would hide the layout's own fresh / minimum tokens."""
    bodies = datasets.labeled_reviews().column("body").to_pylist()
    sentences = [s for body in bodies for s in re.split(r"(?<=[.!?])\s+", body.strip()) if s]
    return pa.table({"id": list(range(min(count, len(sentences)))), "body": sentences[:count]})


def reviews_of_movies(count: int) -> pa.Table:
    """The first `count` labeled reviews' first sentences, each of one of 6 movies (in turn)."""
    bodies = datasets.labeled_reviews().column("body").to_pylist()[:count]
    return pa.table({"id": list(range(len(bodies))), "movie": [i % 6 for i in range(len(bodies))],
                     "body": [b.split(". ")[0].rstrip(".") + "." for b in bodies]})


def run_limits(model: str, precision: str, out: Path, documents: int = DOCUMENTS,
               join_reviews: int = JOIN_REVIEWS) -> int:
    config = quail.EngineConfig(model=model, precision=precision, cache="off")  # type: ignore[arg-type]
    tables = {"many": many_reviews(documents), "sentences": review_sentences(documents),
              "reviews": datasets.labeled_reviews().select(["id", "body"]).slice(0, join_reviews),
              "films": reviews_of_movies(max(join_reviews // 4, 12)),
              "aspects": datasets.aspects().select(["id", "aspect"])}
    lines = []
    for workload in workloads(documents, join_reviews):
        whole = measure(replace(config, **{workload.switch: "off"}), workload, tables)
        early = measure(config, workload, tables)
        mine, theirs = [_keys(row) for row in early.rows], [_keys(row) for row in whole.rows]
        same = f"same {len(early.rows)} rows" if mine == theirs else (
            f"rows differ: {len([r for r in mine if r not in theirs])} of {len(mine)} not in the other plan's "
            f"{len(theirs)} (answers this close to the threshold differ by rounding: run --precision fp32)")
        read = next((line for line in early.explain.splitlines() if line.startswith("stopped after")), None)
        extra = f"; {read}; selectivity over every document {whole.selectivity:.2f}" if read else ""
        if not workload.same_answers:
            moved = [abs(float(a["s"]) - float(b["s"])) for a, b in zip(early.rows, whole.rows, strict=False)]
            extra += (f" (its other words move the scores: mean |Δ| {sum(moved) / len(moved):.3f}, "
                      f"largest {max(moved):.3f})")
        extra += f"; fresh / minimum tokens {early.fresh_tokens / max(early.minimum_tokens, 1):.3f}"
        lines.append(f"{workload.name}: fresh tokens {early.fresh_tokens:,} vs {whole.fresh_tokens:,} with "
                     f"{workload.switch}='off' ({early.fresh_tokens / whole.fresh_tokens:.1%}); wall "
                     f"{early.wall_s:.2f} s vs {whole.wall_s:.2f} s ({whole.wall_s / early.wall_s:.1f}× faster); "
                     f"{same}{extra}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "limits.md").write_text("\n".join([f"# LIMIT met early ({model}, {precision}); each beside "
                                              "early_limit='off'", "", *(f"* {line}" for line in lines), ""]))
    for line in lines:
        print(line)
    return 0


def _keys(row: dict[str, object]) -> dict[str, object]:
    """A row without its score: what must match whatever words the prompt was laid out in."""
    return {name: value for name, value in row.items() if name != "s"}


def measure(config: quail.EngineConfig, workload: LimitWorkload, tables: dict[str, pa.Table]) -> Measured:
    with quail.Session(config) as session:
        for name, table in tables.items():
            session.register(name, table)
        query = session.sql(workload.sql)
        query.plan()  # tokenizing and planning are not what is compared
        started = time.perf_counter()
        result = query.run()
        wall = time.perf_counter() - started
        fresh, minimum = result.report["fresh_tokens"], result.report["minimum_tokens"]
        answers = [value for table in result.answer_tables.values() if "answer" in table.column_names
                   for value in table.column("answer").to_pylist()]
        selectivity = sum(map(bool, answers)) / len(answers) if answers else None
        return Measured(result.to_rows(), fresh if isinstance(fresh, int) else 0,
                        minimum if isinstance(minimum, int) else 0, wall, result.explain(), selectivity)
