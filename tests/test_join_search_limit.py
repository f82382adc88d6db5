"""Join-order search is bounded: exact up to EXHAUSTIVE_JOIN_LIMIT aliases, greedy beyond, and explain says so.

Work is counted in priced join steps (never in seconds): the exact DP prices every subset, about
3^n steps; the greedy search prices O(n^3).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from quail import DocumentProvider, EngineConfig, Session
from quail.catalog.devices import BUILT_IN_DEVICES
from quail.catalog.models import BUILT_IN_MODELS
from quail.planner.cost import CostModel, Lengths
from quail.planner.joins import (
    EXHAUSTIVE_JOIN_LIMIT,
    AliasStats,
    AnchorLayout,
    JoinEdge,
    JoinProblem,
    plan_joins,
    sequence_cost,
)


class StepBudgetExceeded(AssertionError):
    pass


def chain(n: int, budget: int) -> tuple[JoinProblem, list[str]]:
    """A chain t0 – t1 – … of AI joins whose problem refuses to price more than `budget` steps."""
    names = [f"t{i}" for i in range(n)]
    stats = {a: AliasStats(a, Lengths.of([10 + i, 20, 30 + 3 * i][: 2 + i % 2])) for i, a in enumerate(names)}
    edges = []
    for i in range(n - 1):
        pair = (names[i], names[i + 1])
        layouts = {a: AnchorLayout(3, 12, {b: 4 for b in pair if b != a}, 3) for a in pair}
        edges.append(JoinEdge(i, pair, 0.3, layouts))
    model = next(m for m in BUILT_IN_MODELS if m.name == "gemma-3-270m")
    counter = [0]

    class Counted(JoinProblem):
        def step(self, *args, **kwargs):
            counter[0] += 1
            if counter[0] > budget:
                raise StepBudgetExceeded(f"priced more than {budget} join steps for {n} aliases")
            return super().step(*args, **kwargs)

    return Counted(stats, tuple(edges), (), CostModel(model, BUILT_IN_DEVICES[0], 2048)), names


def test_twenty_joined_tables_are_planned_greedily_in_polynomial_work():
    n = 20
    problem, names = chain(n, budget=2 * n ** 3)
    plan = plan_joins(problem, names)
    assert plan is not None and plan.search == "greedy"
    assert sorted(plan.order) == sorted(names)
    assert sequence_cost(problem, plan.order, plan.anchors) == pytest.approx(plan.seconds)


def test_up_to_the_limit_the_search_is_exhaustive():
    problem, names = chain(EXHAUSTIVE_JOIN_LIMIT, budget=10 ** 6)
    plan = plan_joins(problem, names)
    assert plan is not None and plan.search == "exhaustive"


def test_the_greedy_order_is_close_to_the_exact_one_just_past_the_limit():
    problem, names = chain(EXHAUSTIVE_JOIN_LIMIT + 1, budget=10 ** 7)
    exact = plan_joins(problem, names, exhaustive_limit=EXHAUSTIVE_JOIN_LIMIT + 1)
    greedy = plan_joins(problem, names)
    assert exact is not None and greedy is not None and greedy.search == "greedy"
    assert exact.seconds <= greedy.seconds <= 1.5 * exact.seconds


def test_explain_of_a_twenty_table_chain_says_the_order_is_greedy():
    with Session(EngineConfig(backend="example-keyword")) as session:
        for i in range(20):
            rows = pa.table({"id": [1, 2], "x": [f"doc {i} a", f"doc {i} b"]})
            session.register(f"t{i}", DocumentProvider.from_table(rows, "id"))
        joins = " ".join(f"JOIN t{i} ON AI_FILTER(PROMPT('Is {{0}} like {{1}}?', t{i - 1}.x, t{i}.x))"
                         for i in range(1, 20))
        text = session.sql(f"SELECT t0.id FROM t0 {joins}").explain()
    assert "greedy order: 20 tables are more than the exhaustive search's" in text
