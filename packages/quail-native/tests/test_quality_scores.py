"""The quality bench's scores against independent definitions: AUC as the normalised Mann–Whitney U from ranks,
accuracy and balanced accuracy by counting; and the demonstrations it picks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from quail import datasets
from quail_native.benchmark.quality import QUESTIONS, accuracy, auc, balanced_accuracy, demonstrations, query


def ranked_auc(labels: list[bool], margins: list[float]) -> float:
    """U / (n₊ n₋) with average ranks for ties."""
    order = sorted(range(len(margins)), key=lambda i: margins[i])
    ranks = [0.0] * len(margins)
    start = 0
    while start < len(order):
        stop = start
        while stop + 1 < len(order) and margins[order[stop + 1]] == margins[order[start]]:
            stop += 1
        for k in range(start, stop + 1):
            ranks[order[k]] = (start + stop) / 2 + 1
        start = stop + 1
    positives = sum(labels)
    negatives = len(labels) - positives
    u = sum(r for r, label in zip(ranks, labels, strict=True) if label) - positives * (positives + 1) / 2
    return u / (positives * negatives)


@given(st.lists(st.tuples(st.booleans(), st.integers(-5, 5)), min_size=2, max_size=40)
       .filter(lambda pairs: 0 < sum(label for label, _ in pairs) < len(pairs)))
def test_auc_is_the_normalised_mann_whitney_statistic(pairs):
    labels, margins = [label for label, _ in pairs], [float(m) for _, m in pairs]
    assert abs(auc(labels, margins) - ranked_auc(labels, margins)) < 1e-9


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40))
def test_accuracies_count_agreements(pairs):
    labels, decisions = [a for a, _ in pairs], [b for _, b in pairs]
    assert accuracy(labels, decisions) == sum(a == b for a, b in pairs) / len(pairs)
    assert balanced_accuracy(labels, [True] * len(labels)) == (0.5 if len(set(labels)) == 2 else 1.0 if all(labels)
                                                              else 0.0)


def test_demonstrations_are_labelled_reviews_outside_the_measured_set_two_per_side():
    measured = {str(r["body"]) for r in datasets.labeled_reviews().to_pylist()}
    for question in QUESTIONS:
        shots = demonstrations(question)
        assert [answer for _, answer in shots] == [True, False, True, False]
        assert not {text for text, _ in shots} & measured
        by_text = {str(r["body"]): r for r in datasets.reviews().to_pylist()}
        assert all(question.holds(by_text[text]) == answer for text, answer in shots)
        assert "{'examples': [(" in query(question, shots) and "''" not in question.text
