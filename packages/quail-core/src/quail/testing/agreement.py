"""How far two backends' answers to the same query agree: every filter and join answer, by key.

Backend agreement tests (vLLM, SGLang against native) compare answers and margins item by item:
an item is a (document, predicate) for a filter and a tuple of rows for a join, so a backend that
answered in another order or skipped differently is still compared fairly.
"""

from __future__ import annotations

from quail.backends import shapes
from quail.runtime.results import QueryResult

Key = tuple[int, ...]
Answers = dict[str, dict[Key, tuple[bool, float]]]
Disagreement = tuple[str, Key, float, float]


def answers(result: QueryResult) -> Answers:
    """Every filter and join answer by kind: (document, predicate) or (anchor row, partner row) → (answer, margin)."""
    found: Answers = {"filter": {}, "join": {}}
    for table in result.answer_tables.values():
        kind = shapes.kind_of(table)
        if kind not in ("filter_answers", "join_answers"):
            continue  # the rows a RequestExecution leaves, which the runner keeps beside its answers
        keys = [c for c in table.column_names if c not in ("answer", "margin")]
        columns = [table.column(c).to_pylist() for c in sorted(keys)]
        values = zip(table.column("answer").to_pylist(), table.column("margin").to_pylist(), strict=True)
        bucket = found["filter" if kind == "filter_answers" else "join"]
        bucket.update({tuple(k): v for k, v in zip(zip(*columns, strict=True), values, strict=True)})
    return found


def compare(reference: QueryResult, other: QueryResult,
            near_zero: float) -> tuple[int, int, float, list[Disagreement]]:
    """(items both answered, items they agree on, worst |Δmargin|, disagreements with their margins).

    Asserts that `other` answered ≥ 99% of the reference's items and that every disagreement sits
    within `near_zero` of a zero margin on one side.
    """
    mine, theirs = answers(reference), answers(other)
    total = agreed = 0
    worst = 0.0
    disagreements: list[Disagreement] = []
    for kind in ("filter", "join"):
        shared = mine[kind].keys() & theirs[kind].keys()
        assert len(shared) >= 0.99 * len(mine[kind]), f"{kind}: too few answers in common"
        for key in shared:
            (a, m), (b, n) = mine[kind][key], theirs[kind][key]
            total += 1
            worst = max(worst, abs(m - n))
            if a == b:
                agreed += 1
            else:
                disagreements.append((kind, key, m, n))
    for _, _, m, n in disagreements:
        assert min(abs(m), abs(n)) < near_zero, f"a disagreement far from zero margin: {m:.4f} vs {n:.4f}"
    return total, agreed, worst, disagreements
