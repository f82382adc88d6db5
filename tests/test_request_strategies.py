"""The request schedules alone, on a minimal in-memory engine (no vLLM needed): what each strategy submits."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from quail.prompts import AnswerTokens
from quail.requests.engine import EngineAnswer, EngineRequest, margin_of
from quail.requests.strategies import AnchorWork, FilterWork, JoinWork, Tally, join_order, run_filter, run_join

LABELS = AnswerTokens((1,), (2,))


class ListEngine:
    """Answers margin = last prompt token − 50, one request per step; records every batch and submission."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.batches: list[list[tuple[int, ...]]] = []
        self.queue: list[EngineRequest] = []
        self.peak = 0

    def kv_capacity_tokens(self) -> int:
        return self.capacity

    def answer(self, request: EngineRequest) -> EngineAnswer:
        return EngineAnswer(request.key, float(request.tokens[-1] - 50), len(request.tokens), 0)

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineAnswer]:
        self.batches.append([r.tokens for r in requests])
        return [self.answer(r) for r in reversed(requests)]  # any order: callers match by key

    def submit(self, request: EngineRequest) -> None:
        self.queue.append(request)
        self.peak = max(self.peak, len(self.queue))

    def step(self) -> list[EngineAnswer]:
        return [self.answer(self.queue.pop(0))] if self.queue else []

    def close(self) -> None:
        pass


def filter_work(rows: list[int]) -> FilterWork:
    # stage k of row r ends in token 100 (TRUE) unless r is divisible by k + 2 (token 0: FALSE)
    return FilterWork(rows, 3, lambda r, k: (9, r, k, 0 if r % (k + 2) == 0 else 100), lambda _k, m: m > 0, LABELS)


@pytest.mark.parametrize("strategy", ["operator", "pipelined"])
def test_a_document_stops_at_its_first_false_stage_in_every_filter_schedule(strategy):
    rows = list(range(1, 13))
    verdicts = run_filter(ListEngine(1 << 20), strategy, filter_work(rows), Tally())
    for row in rows:
        stages = [v.stage for v in verdicts if v.rows == (row,)]
        first_false = next((k for k in range(3) if row % (k + 2) == 0), 2)
        assert stages == list(range(first_false + 1))
    assert [v.rows for v in verdicts] == sorted(v.rows for v in verdicts)


def test_operator_filters_send_one_batch_per_stage():
    engine = ListEngine(1 << 20)
    run_filter(engine, "operator", filter_work(list(range(1, 13))), Tally())
    assert len(engine.batches) == 3 and len(engine.batches[0]) == 12


def test_pipelined_filters_keep_live_documents_under_the_kv_capacity():
    engine = ListEngine(capacity=8 * 3)  # prompts are 4 tokens: 6 fit at once
    run_filter(engine, "pipelined", filter_work(list(range(1, 30))), Tally())
    assert engine.peak == 6 and not engine.batches


def join_work(stop_at_true: bool) -> JoinWork:
    anchors = [AnchorWork(a, (7, a), tuple(((a, p), (p, 100 if (a + p) % 3 == 0 else 0)) for p in range(4)))
               for a in range(3)]
    return JoinWork(anchors, stop_at_true, lambda m: m > 0, LABELS)


def test_the_fit_check_chooses_suffix_major_only_when_every_anchor_prefix_fits():
    assert join_order(ListEngine(3 * (2 + 2)), "fit", join_work(False)) == "suffix_major"
    assert join_order(ListEngine(3 * (2 + 2) - 1), "fit", join_work(False)) == "anchor_major"


def test_suffix_major_asks_one_partner_of_every_anchor_per_wave_and_answers_anchor_major():
    engine = ListEngine(1 << 20)
    verdicts = run_join(engine, "suffix_major", join_work(False), Tally())
    assert [len(b) for b in engine.batches] == [3, 3, 3, 3]
    assert [b[0][:2] for b in engine.batches[0:1]] == [(7, 0)]
    assert [v.rows for v in verdicts] == [(a, p) for a in range(3) for p in range(4)]


def test_exists_joins_stop_asking_an_anchor_after_its_first_true():
    verdicts = run_join(ListEngine(1 << 20), "suffix_major", join_work(True), Tally())
    for anchor in range(3):
        answers = [v.answer for v in verdicts if v.rows[0] == anchor]
        assert answers.count(True) <= 1 and (True not in answers or answers[-1])


def test_anchor_major_sends_every_tuple_in_one_batch_anchor_by_anchor():
    engine = ListEngine(1 << 20)
    run_join(engine, "anchor_major", join_work(False), Tally())
    assert [t[1] for t in engine.batches[0]] == [a for a in range(3) for _ in range(4)]


def test_margin_is_max_true_minus_max_false_and_a_missing_label_is_an_error():
    assert margin_of({1: -1.0, 3: -0.5, 2: -2.0}, (1, 3), (2,)) == 1.5
    with pytest.raises(RuntimeError, match="no log-probability"):
        margin_of({1: -1.0}, (1,), (2,))
