"""The planner against brute force: filter order and join order × anchors equal the exhaustive optimum.

Every instance is drawn from a seeded `random.Random`: per-alias document length summaries, 1–4
filters per alias with selectivities (some missing, some 0 or 1), 1–3 AI join predicates over 2–4
aliases whose AI and equality edges connect them (sometimes a 3-alias predicate, sometimes a user-fixed
anchor, random kv_retained flags), and a CostModel from a catalog model and device whose chunk_tokens
sits near the anchors' worst tuples so that some anchors — sometimes all — are infeasible.

The enumerators here know nothing of the planner's search: they try every permutation (and every
anchor per edge) and price each with the planner's own per-sequence pricing.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from itertools import permutations, product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quail.catalog.devices import BUILT_IN_DEVICES, DeviceSpec
from quail.catalog.models import BUILT_IN_MODELS, ModelSpec
from quail.planner.cost import ANSWER_COLUMNS, CostModel, Lengths, Work, ask, precision_of, scan, stream, triangle
from quail.planner.filters import (
    DEFAULT_SELECTIVITY,
    StagePrice,
    expected_seconds,
    order_filters,
    selectivity_of,
    survival,
)
from quail.planner.joins import (
    AliasStats,
    AnchorLayout,
    EqualityEdge,
    JoinEdge,
    JoinProblem,
    plan_joins,
    sequence_cost,
)

INSTANCES = 300
REL = 1e-9
NAMES = ("r", "m", "b", "u", "x", "a")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-300)


# ------------------------------------------------------------------------------------------------
# Random instances
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instance:
    seed: int
    cost: CostModel
    filters: dict[str, list[StagePrice]]
    problem: JoinProblem
    aliases: tuple[str, ...]

    def describe(self) -> str:
        return (f"seed={self.seed} model={self.cost.model.name} device={self.cost.device.name} "
                f"chunk={self.cost.chunk_tokens}\n stats={dict(self.problem.stats)}\n edges={self.problem.edges}\n"
                f" equalities={self.problem.equalities}\n filters={self.filters}")


def _document_lengths(rng: random.Random) -> list[int]:
    count = rng.choice([1, 2, 3, rng.randint(1, 40), rng.randint(1, 400)])
    style = rng.random()
    if style < 0.3:
        base = rng.randint(5, 3000)
        return [base] * count  # constant length: no variance
    if style < 0.6:
        return [rng.randint(1, 200) for _ in range(count)]
    return [int(rng.lognormvariate(5.5, 1.2)) + 1 for _ in range(count)]  # long tail


def _selectivity(rng: random.Random) -> float | None:
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.22:
        return 0.0
    if roll < 0.29:
        return 1.0
    return rng.random()


def _filter_stages(rng: random.Random, cost: CostModel, documents: Lengths) -> list[StagePrice]:
    """1–4 predicates priced as the optimizer prices them (or, sometimes, arbitrary prices)."""
    count = rng.randint(1, 4)
    positions = rng.sample(range(1, 20), count)
    preamble, frame = rng.randint(1, 8), rng.randint(0, 40)
    prefix = documents.plus(preamble + frame)
    stages = []
    for position in positions:
        selectivity, assumed = selectivity_of(_selectivity(rng))
        if rng.random() < 0.2:
            scan_seconds, ask_seconds = rng.uniform(0, 10), rng.uniform(0, 10)
        else:
            question = rng.randint(1, 60)
            questions = Lengths(documents.count, documents.count * question, documents.count * question**2,
                                float(question))
            scan_seconds = cost.seconds(scan(prefix.plus(question)))
            ask_seconds = cost.seconds(ask(prefix, questions))
        stages.append(StagePrice(position, selectivity, assumed, scan_seconds, ask_seconds))
    return stages


def _layout(rng: random.Random, anchor: str, aliases: tuple[str, ...]) -> AnchorLayout:
    labels = {p: rng.randint(1, 8) for p in aliases if p != anchor}
    return AnchorLayout(rng.randint(1, 10), rng.randint(0, 60), labels, rng.randint(1, 6))


def _edges(rng: random.Random, aliases: list[str]) -> tuple[list[tuple[str, ...]], list[tuple[str, str]]]:
    """AI predicates (1–3, some over 3 aliases) and equalities that together connect every alias."""
    ai: list[tuple[str, ...]] = []
    equalities: list[tuple[str, str]] = []
    order = aliases[:]
    rng.shuffle(order)
    i = 1
    if len(order) >= 3 and rng.random() < 0.35:  # one multi-way predicate over three aliases
        triple = tuple(order[:3])
        ai.append(tuple(rng.sample(triple, 3)))
        i = 3
    while i < len(order):
        new, old = order[i], rng.choice(order[:i])
        if rng.random() < 0.25 and (ai or i < len(order) - 1):
            equalities.append((old, new) if rng.random() < 0.5 else (new, old))
        else:
            ai.append((old, new) if rng.random() < 0.5 else (new, old))
        i += 1
    if not ai:
        ai.append(tuple(rng.sample(aliases, 2)))
    while len(ai) < 3 and rng.random() < 0.3:  # extra predicates: cycles, sometimes two completing at once
        ai.append(tuple(rng.sample(aliases, 2)))
    if rng.random() < 0.3:
        equalities.append(tuple(rng.sample(aliases, 2)))  # type: ignore[arg-type]
    return ai[:3], equalities


def _worst_tuple(stats: dict[str, AliasStats], aliases: tuple[str, ...], anchor: str, layout: AnchorLayout) -> int:
    partners = sum(layout.labels[p] + stats[p].documents.maximum for p in aliases if p != anchor)
    return int(stats[anchor].documents.maximum + layout.preamble + layout.frame + layout.cue + partners)


def _chunk_tokens(rng: random.Random, needs: dict[int, list[int]]) -> int:
    """Around the worst tuples: mostly every edge keeps at least one anchor, often not all of them."""
    every = sorted(n for ns in needs.values() for n in ns)
    roll = rng.random()
    if roll < 0.1:
        return rng.choice([8192, 32768, 131072])
    if roll < 0.22:
        return max(1, every[0] - rng.randint(1, 50))  # no anchor of any edge fits
    enough = max(min(ns) for ns in needs.values())  # the least chunk where every edge has an anchor
    return max(1, rng.choice([n for n in every if n >= enough]) + rng.choice([0, 0, 0, 1, 7, -1]))


def _star(rng: random.Random, aliases: list[str]) -> tuple[list[tuple[str, ...]], list[tuple[str, str]]]:
    """Every predicate shares one alias: where keeping its KV for a later predicate pays off."""
    center = aliases[0]
    ai = [(center, other) if rng.random() < 0.5 else (other, center) for other in aliases[1:]]
    return ai, []


def make_instance(seed: int) -> Instance:
    rng = random.Random(seed)
    model: ModelSpec = rng.choice(BUILT_IN_MODELS)
    device: DeviceSpec = rng.choice(BUILT_IN_DEVICES)
    star = rng.random() < 0.4
    aliases = rng.sample(NAMES, rng.randint(3, 4) if star else rng.randint(2, 4))
    if star:  # few documents per alias: prefix scans weigh as much as the pair asks
        documents = {a: Lengths.of([rng.randint(1, 3000) for _ in range(rng.randint(1, 6))]) for a in aliases}
    else:
        documents = {a: Lengths.of(_document_lengths(rng)) for a in aliases}
    filter_cost = CostModel(model, device, rng.choice([512, 2048, 8192]))
    filters = {a: _filter_stages(rng, filter_cost, documents[a]) for a in aliases if rng.random() < 0.8}
    stats = {}
    for a in aliases:
        alive = survival(filters[a]) if a in filters and rng.random() < 0.7 else rng.choice([1.0, rng.random()])
        if star:
            alive = max(alive, 0.5)
        retained = rng.random() < (0.1 if star else 0.3)
        stats[a] = AliasStats(a, documents[a].scaled(alive), kv_retained=retained)
    ai, pairs = _star(rng, aliases) if star else _edges(rng, aliases)
    edges, needs = [], {}
    for position, edge_aliases in enumerate(ai, start=100):
        anchors = sorted(set(edge_aliases))
        if rng.random() < 0.25:
            anchors = [rng.choice(anchors)]  # a user-fixed anchor
        layouts = {anchor: _layout(rng, anchor, edge_aliases) for anchor in anchors}
        needs[position] = [_worst_tuple(stats, edge_aliases, anchor, layout) for anchor, layout in layouts.items()]
        selectivity = _selectivity(rng)
        edges.append(JoinEdge(position, edge_aliases, DEFAULT_SELECTIVITY if selectivity is None else selectivity,
                              layouts))
    equalities = tuple(EqualityEdge(pair, rng.choice([rng.random(), 1e-3, 1.0])) for pair in pairs)
    cost = CostModel(model, device, _chunk_tokens(rng, needs))
    problem = JoinProblem(stats, tuple(edges), equalities, cost)
    return Instance(seed, filter_cost, filters, problem, tuple(aliases))


INSTANCE_LIST = [make_instance(seed) for seed in range(INSTANCES)]


# ------------------------------------------------------------------------------------------------
# Exhaustive enumerators (independent of order_filters and plan_joins)
# ------------------------------------------------------------------------------------------------


def exhaustive_filter_minimum(stages: list[StagePrice]) -> float:
    return min(expected_seconds(list(order)) for order in permutations(stages))


def anchor_choices(problem: JoinProblem) -> list[dict[int, str]]:
    """Every assignment of one of its layouts' anchors to every edge."""
    per_edge = [[(edge.position, anchor) for anchor in sorted(edge.layouts)] for edge in problem.edges]
    return [dict(choice) for choice in product(*per_edge)]


def every_sequence(problem: JoinProblem, aliases: tuple[str, ...]
                   ) -> list[tuple[float | None, tuple[str, ...], dict[int, str]]]:
    """Each left-deep order × anchor assignment with its cost (None when infeasible)."""
    return [(sequence_cost(problem, order, anchors), order, anchors)
            for order in permutations(aliases) for anchors in anchor_choices(problem)]


def exhaustive_join_minimum(problem: JoinProblem, aliases: tuple[str, ...]
                            ) -> tuple[float, tuple[str, ...], dict[int, str]] | None:
    best = None
    for seconds, order, anchors in every_sequence(problem, aliases):
        if seconds is not None and (best is None or seconds < best[0]):
            best = (seconds, order, anchors)
    return best


EXHAUSTIVE: dict[int, tuple[float, tuple[str, ...], dict[int, str]] | None] = {}


def exhaustive_of(inst: Instance) -> tuple[float, tuple[str, ...], dict[int, str]] | None:
    if inst.seed not in EXHAUSTIVE:
        EXHAUSTIVE[inst.seed] = exhaustive_join_minimum(inst.problem, inst.aliases)
    return EXHAUSTIVE[inst.seed]


# ------------------------------------------------------------------------------------------------
# Filters
# ------------------------------------------------------------------------------------------------


def test_enough_filter_instances_of_every_size():
    sizes = [len(stages) for inst in INSTANCE_LIST for stages in inst.filters.values()]
    assert len(INSTANCE_LIST) >= 200
    for size in (1, 2, 3, 4):
        assert sizes.count(size) >= 50, (size, sizes.count(size))


def test_by_cost_filter_order_equals_the_minimum_over_all_permutations():
    mismatches = []
    checked = 0
    for inst in INSTANCE_LIST:
        for alias, stages in inst.filters.items():
            chosen = order_filters(alias, stages, "by_cost")
            best = exhaustive_filter_minimum(stages)
            by_position = {s.position: s for s in stages}
            replayed = expected_seconds([by_position[p] for p in chosen.positions])
            checked += 1
            if not (close(chosen.seconds, best) and close(replayed, best)):
                mismatches.append((inst.seed, alias, chosen, best, replayed))
    assert checked >= 400
    assert not mismatches, mismatches[:3]


def test_by_cost_filter_order_is_a_permutation_of_the_predicates_and_keeps_survival():
    for inst in INSTANCE_LIST:
        for alias, stages in inst.filters.items():
            chosen = order_filters(alias, stages, "by_cost")
            assert sorted(chosen.positions) == sorted(s.position for s in stages)
            assert chosen.alias == alias
            assert close(chosen.survival, math.prod(s.selectivity for s in stages))


def test_as_written_filter_order_keeps_the_written_order():
    for inst in INSTANCE_LIST:
        for alias, stages in inst.filters.items():
            written = sorted(stages, key=lambda s: s.position)
            kept = order_filters(alias, stages, "as_written")
            assert kept.positions == tuple(s.position for s in written)
            assert kept.seconds == expected_seconds(written)
            assert close(kept.survival, math.prod(s.selectivity for s in stages))
            assert kept.seconds >= order_filters(alias, stages, "by_cost").seconds * (1 - REL)


def test_filter_order_prefers_the_selective_cheap_predicate_first():
    cheap_selective = StagePrice(1, 0.1, False, scan_seconds=1.0, ask_seconds=0.1)
    costly_loose = StagePrice(2, 0.9, False, scan_seconds=5.0, ask_seconds=2.0)
    chosen = order_filters("r", [costly_loose, cheap_selective], "by_cost")
    assert chosen.positions == (1, 2)
    assert chosen.seconds == pytest.approx(1.0 + 0.1 * 2.0)
    assert order_filters("r", [costly_loose, cheap_selective], "as_written").positions == (1, 2)


def test_expected_seconds_scans_the_first_stage_and_asks_the_survivors_of_the_rest():
    a = StagePrice(3, 0.5, False, scan_seconds=4.0, ask_seconds=1.0)
    b = StagePrice(1, 0.25, False, scan_seconds=8.0, ask_seconds=2.0)
    c = StagePrice(2, 0.0, False, scan_seconds=9.0, ask_seconds=3.0)
    assert expected_seconds([]) == 0.0
    assert expected_seconds([a, b, c]) == 4.0 + 0.5 * 2.0 + 0.5 * 0.25 * 3.0
    assert expected_seconds([c, a, b]) == 9.0  # nothing survives the first stage


def test_missing_selectivity_is_the_assumed_default():
    assert selectivity_of(None) == (DEFAULT_SELECTIVITY, True)
    assert selectivity_of(0.7) == (0.7, False)


def test_order_filters_needs_at_least_one_stage():
    with pytest.raises(ValueError):
        order_filters("r", [], "by_cost")


# ------------------------------------------------------------------------------------------------
# Joins
# ------------------------------------------------------------------------------------------------


def test_generated_join_instances_cover_the_interesting_cases():
    three_way = sum(any(len(e.aliases) == 3 for e in i.problem.edges) for i in INSTANCE_LIST)
    fixed = sum(any(len(e.layouts) == 1 for e in i.problem.edges) for i in INSTANCE_LIST)
    equal = sum(bool(i.problem.equalities) for i in INSTANCE_LIST)
    retained = sum(any(s.kv_retained for s in i.problem.stats.values()) for i in INSTANCE_LIST)
    sizes = [len(i.aliases) for i in INSTANCE_LIST]
    edges = [len(i.problem.edges) for i in INSTANCE_LIST]
    models = {i.cost.model.name for i in INSTANCE_LIST}
    devices = {i.cost.device.name for i in INSTANCE_LIST}
    assert min(three_way, fixed, equal, retained) >= 30, (three_way, fixed, equal, retained)
    assert {2, 3, 4} <= set(sizes) and {1, 2, 3} <= set(edges)
    assert len(models) == len(BUILT_IN_MODELS) and len(devices) == len(BUILT_IN_DEVICES)


def _connected(problem: JoinProblem, aliases: tuple[str, ...]) -> bool:
    links = [set(e.aliases) for e in problem.edges] + [set(e.aliases) for e in problem.equalities]
    reached = {aliases[0]}
    grew = True
    while grew:
        grew = False
        for link in links:
            if link & reached and not link <= reached:
                reached |= link
                grew = True
    return reached == set(aliases)


def test_generated_join_graphs_are_connected():
    assert all(_connected(i.problem, i.aliases) for i in INSTANCE_LIST)


def test_plan_joins_equals_the_minimum_over_every_order_and_anchor():
    mismatches = []
    feasible = infeasible = partial = 0
    for inst in INSTANCE_LIST:
        plan = plan_joins(inst.problem, inst.aliases)
        best = exhaustive_of(inst)
        if (plan is None) != (best is None):
            mismatches.append((inst.describe(), plan, best))
            continue
        if plan is None:
            infeasible += 1
            continue
        feasible += 1
        if not close(plan.seconds, best[0]):
            mismatches.append((inst.describe(), plan, best))
        partial += any(c is None for c, _, _ in every_sequence(inst.problem, inst.aliases))
    assert not mismatches, mismatches[:2]
    assert feasible >= 150 and infeasible >= 20 and partial >= 50, (feasible, infeasible, partial)


def _optimum_needs_a_dearer_partial(inst: Instance) -> bool:
    """Whether the best plan starts with a join of its first k aliases that is not their cheapest one."""
    problem, best = inst.problem, exhaustive_of(inst)
    if best is None:
        return False
    _, order, anchors = best
    for k in range(2, len(order)):
        prefix = sequence_cost(problem, order[:k], anchors)
        inside = [e for e in problem.edges if set(e.aliases) <= set(order[:k])]
        choices = [dict(c) for c in product(*[[(e.position, a) for a in sorted(e.layouts)] for e in inside])]
        cheapest = min((c for p in permutations(order[:k]) for a in choices
                        if (c := sequence_cost(problem, p, a)) is not None), default=None)
        if prefix is not None and cheapest is not None and prefix > cheapest * (1 + REL):
            return True
    return False


def test_some_instances_need_a_non_cheapest_partial_plan_kept_for_its_resident_kv():
    """The optimum sometimes extends a dearer partial join that left more anchor KV resident."""
    needing = [i.seed for i in INSTANCE_LIST if _optimum_needs_a_dearer_partial(i)]
    assert len(needing) >= 3, needing


def test_the_chosen_join_plan_reprices_to_its_own_cost():
    for inst in INSTANCE_LIST:
        plan = plan_joins(inst.problem, inst.aliases)
        if plan is None:
            continue
        assert sorted(plan.order) == sorted(inst.aliases)
        assert len(plan.steps) == len(inst.aliases) - 1
        assert set(plan.anchors) == {e.position for e in inst.problem.edges}
        for edge in inst.problem.edges:
            assert plan.anchors[edge.position] in edge.layouts
        repriced = sequence_cost(inst.problem, plan.order, plan.anchors)
        assert repriced is not None and close(repriced, plan.seconds), inst.describe()
        assert close(sum(s.seconds for s in plan.steps), plan.seconds)
        assert close(plan.tuples, inst.problem.tuples(frozenset(inst.aliases)))


def test_join_order_is_independent_of_the_order_aliases_are_listed_in():
    for inst in INSTANCE_LIST[:100]:
        forward = plan_joins(inst.problem, inst.aliases)
        backward = plan_joins(inst.problem, tuple(reversed(inst.aliases)))
        assert (forward is None) == (backward is None)
        if forward is not None:
            assert close(forward.seconds, backward.seconds)


def test_a_user_fixed_anchor_is_the_only_anchor_used():
    for inst in INSTANCE_LIST:
        plan = plan_joins(inst.problem, inst.aliases)
        if plan is None:
            continue
        for edge in inst.problem.edges:
            if len(edge.layouts) == 1:
                assert plan.anchors[edge.position] == next(iter(edge.layouts))


def test_reusing_a_retained_anchor_never_costs_more():
    for inst in INSTANCE_LIST[:150]:
        kept = {a: AliasStats(s.alias, s.documents, kv_retained=True) for a, s in inst.problem.stats.items()}
        richer = JoinProblem(kept, inst.problem.edges, inst.problem.equalities, inst.problem.cost)
        before, after = plan_joins(inst.problem, inst.aliases), plan_joins(richer, inst.aliases)
        assert (before is None) == (after is None)
        if before is not None:
            assert after.seconds <= before.seconds * (1 + REL)


def _two_alias_problem(chunk: int, retained: bool = False) -> tuple[JoinProblem, CostModel]:
    model = next(m for m in BUILT_IN_MODELS if m.name == "qwen3-0.6b")
    device = next(d for d in BUILT_IN_DEVICES if d.name == "h100-sxm")
    cost = CostModel(model, device, chunk)
    stats = {"r": AliasStats("r", Lengths.of([100, 300]), kv_retained=retained),
             "m": AliasStats("m", Lengths.of([10, 20, 30]))}
    layouts = {"r": AnchorLayout(preamble=4, frame=6, labels={"m": 3}, cue=2),
               "m": AnchorLayout(preamble=4, frame=6, labels={"r": 3}, cue=2)}
    edge = JoinEdge(1, ("r", "m"), 0.5, layouts)
    return JoinProblem(stats, (edge,), (), cost), cost


def test_a_join_step_is_the_anchor_scan_plus_the_partner_asks_by_hand():
    problem, cost = _two_alias_problem(chunk=4096)
    # Anchored on r, m joined second: r's 2 prefixes (doc + preamble 4 + frame 6) scanned once,
    # then each of the 6 pairs asks [label 3][m doc][cue 2] (mean 3 + 20 + 2 = 25 tokens).
    prefix = Lengths.of([110, 310])
    variance = (100 + 400 + 900) / 3 - 20**2
    suffix = Lengths(6, 6 * 25, 6 * (variance + 25**2), 3 + 30 + 2)
    expected = cost.seconds(scan(prefix, answers=False)) + cost.seconds(ask(prefix, suffix))
    assert sequence_cost(problem, ("r", "m"), {1: "r"}) == pytest.approx(expected, rel=1e-12)
    assert sequence_cost(problem, ("m", "r"), {1: "r"}) == pytest.approx(expected, rel=1e-12)


def test_a_retained_anchor_only_asks_its_frame():
    problem, cost = _two_alias_problem(chunk=4096, retained=True)
    prefix = Lengths.of([104, 304])
    frames = Lengths(2, 12, 72, 6)
    variance = (100 + 400 + 900) / 3 - 20**2
    suffix = Lengths(6, 6 * 25, 6 * (variance + 25**2), 35)
    expected = (cost.seconds(ask(prefix, frames, answers=False))
                + cost.seconds(ask(prefix.plus(6), suffix)))
    assert sequence_cost(problem, ("r", "m"), {1: "r"}) == pytest.approx(expected, rel=1e-12)


def test_an_anchor_whose_worst_tuple_exceeds_the_chunk_is_infeasible():
    # Anchored on r the worst tuple is 300 + 4 + 6 + 3 + 30 + 2 = 345 tokens.
    fits, _ = _two_alias_problem(chunk=345)
    assert sequence_cost(fits, ("r", "m"), {1: "r"}) is not None
    tight, _ = _two_alias_problem(chunk=344)
    assert sequence_cost(tight, ("r", "m"), {1: "r"}) is None
    assert sequence_cost(tight, ("r", "m"), {1: "m"}) is None
    assert plan_joins(tight, ("r", "m")) is None
    assert plan_joins(fits, ("r", "m")) is not None


def test_two_predicates_completed_by_one_alias_are_infeasible():
    problem, cost = _two_alias_problem(chunk=4096)
    other = JoinEdge(2, ("m", "r"), 0.5, problem.edges[0].layouts)
    both = JoinProblem(problem.stats, (problem.edges[0], other), (), cost)
    assert plan_joins(both, ("r", "m")) is None
    assert exhaustive_join_minimum(both, ("r", "m")) is None


# ------------------------------------------------------------------------------------------------
# Cost model
# ------------------------------------------------------------------------------------------------

TOY = ModelSpec(name="toy", architecture="qwen3", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128,
                vocab=1000, context_length=4096)
TOY_DEVICE = DeviceSpec(name="toy-device", kind="cuda", memory_bytes=1e10, peak_bf16_flops=1e12,
                        peak_fp32_flops=5e11, bandwidth_bytes_per_s=1e10)
# layer: q,o 2·64·4·16 + k,v 2·64·2·16 + qk norms 2·16 + mlp 3·64·128 + 2 norms·64 = 37024; + final norm 64.
TOY_PARAMS = 2 * 37024 + 64
TOY_KAPPA = 2 * 2 * 2 * 16 * 2  # 2 · layers · kv_heads · head_dim · bytes
TOY_PAIR_FLOPS = 4 * 4 * 16 * 2  # 4 · heads · head_dim · layers


def test_triangle_counts_causal_pairs():
    assert triangle(Lengths.of([1])) == 1
    assert triangle(Lengths.of([3, 5])) == 6 + 15
    assert triangle(Lengths.of([10] * 4)) == 4 * 55


def test_scan_work_by_hand():
    work = scan(Lengths.of([3, 5]))
    assert work == Work(tokens=8, pairs=21, kv_read=0, kv_written=8, answers=2)
    assert scan(Lengths.of([3, 5]), answers=False).answers == 0


def test_ask_work_by_hand_is_s_times_p_plus_t_of_s():
    # Two prefixes of 10 tokens, questions of 3: pairs per item 3·10 + T(3) = 36.
    work = ask(Lengths.of([10, 10]), Lengths.of([3, 3]))
    assert work == Work(tokens=6, pairs=72, kv_read=20, kv_written=6, answers=2)
    # Unequal lengths: Σ S·P is priced by the product of means (prefixes independent of questions).
    mixed = ask(Lengths.of([10, 20]), Lengths.of([2, 4]), answers=False)
    assert mixed.pairs == 2 * 15 * 3 + (3 + 10)
    assert mixed.kv_read == 30 and mixed.kv_written == 6 and mixed.answers == 0


def test_stream_is_the_sum_of_its_asks():
    prefixes, q1, q2 = Lengths.of([50, 70]), Lengths.of([3, 3]), Lengths.of([5, 1])
    assert stream(prefixes, [q1, q2]) == ask(prefixes, q1) + ask(prefixes, q2)
    assert stream(prefixes, []) == Work()


def test_ask_after_scan_costs_the_same_tokens_as_one_scan_of_the_whole():
    prefixes, questions = Lengths.of([40, 40]), Lengths.of([7, 7])
    together = scan(prefixes.plus(7))
    split = scan(prefixes) + ask(prefixes, questions)
    assert split.tokens == together.tokens and split.pairs == together.pairs
    assert split.kv_written == together.kv_written


lengths_lists = st.lists(st.integers(0, 5000), min_size=1, max_size=30)


@given(lengths_lists, st.integers(0, 1000), st.integers(0, 1000))
def test_lengths_plus_is_every_sequence_longer(lengths, a, b):
    base = Lengths.of(lengths)
    assert base.plus(a) == Lengths.of([n + a for n in lengths])
    assert base.plus(a).plus(b) == base.plus(a + b)
    assert base.plus(0) == base


@given(lengths_lists, st.floats(0.01, 1.0), st.floats(0.01, 1.0), st.integers(0, 500))
def test_lengths_scaled_keeps_means_and_maximum(lengths, f, g, c):
    base = Lengths.of(lengths)
    assert base.scaled(1.0) == base
    scaled = base.scaled(f)
    assert scaled.maximum == base.maximum
    assert scaled.mean == pytest.approx(base.mean, rel=1e-12)
    assert scaled.mean_square == pytest.approx(base.mean_square, rel=1e-12)
    twice, once = base.scaled(f).scaled(g), base.scaled(f * g)
    for field in ("count", "total", "squares"):
        assert getattr(twice, field) == pytest.approx(getattr(once, field), rel=1e-12)
    left, right = base.scaled(f).plus(c), base.plus(c).scaled(f)
    for field in ("count", "total", "squares", "maximum"):
        assert getattr(left, field) == pytest.approx(getattr(right, field), rel=1e-12)


def test_lengths_of_and_empty_means():
    assert Lengths.of([2, 4]) == Lengths(2, 6, 20, 4)
    assert Lengths.of([]) == Lengths(0, 0, 0, 0)
    assert Lengths.of([]).mean == 0.0 and Lengths.of([]).mean_square == 0.0


def test_work_adds_and_scales_field_by_field():
    a, b = Work(1, 2, 3, 4, 5), Work(10, 20, 30, 40, 50)
    assert a + b == Work(11, 22, 33, 44, 55)
    assert a.times(3) == Work(3, 6, 9, 12, 15)


def test_toy_model_parameters_by_hand():
    assert TOY.non_embedding_params == TOY_PARAMS
    assert TOY.kv_bytes_per_token == TOY_KAPPA


def test_roofline_dense_is_compute_bound_when_chunks_are_long():
    # Weights re-read once per pass of `chunk` tokens: compute-bound iff chunk > peak / bandwidth = 100.
    cost = CostModel(TOY, TOY_DEVICE, chunk_tokens=1000)
    tokens = 5000
    assert cost.seconds(Work(tokens=tokens)) == pytest.approx(2 * TOY_PARAMS * tokens / 1e12, rel=1e-12)


def test_roofline_dense_is_bandwidth_bound_when_chunks_are_short():
    cost = CostModel(TOY, TOY_DEVICE, chunk_tokens=10)
    tokens = 5000
    weight_bytes = TOY_PARAMS * 2 * (tokens / 10)
    assert cost.seconds(Work(tokens=tokens)) == pytest.approx(weight_bytes / 1e10, rel=1e-12)
    assert weight_bytes / 1e10 > 2 * TOY_PARAMS * tokens / 1e12


def test_roofline_attention_picks_the_slower_of_pair_flops_and_kv_traffic():
    cost = CostModel(TOY, TOY_DEVICE, chunk_tokens=1000)
    assert cost.seconds(Work(pairs=1e6)) == pytest.approx(TOY_PAIR_FLOPS * 1e6 / 1e12, rel=1e-12)
    assert cost.seconds(Work(kv_read=1e3, kv_written=1e3)) == pytest.approx(TOY_KAPPA * 2e3 / 1e10, rel=1e-12)
    # 1e6 pairs take 5.12e-4 s of compute; 1e3 KV rows take 2.56e-5 s: compute wins.
    assert cost.seconds(Work(pairs=1e6, kv_read=1e3)) == pytest.approx(TOY_PAIR_FLOPS * 1e6 / 1e12, rel=1e-12)
    # 1e3 pairs take 5.12e-7 s; 1e5 KV rows take 2.56e-3 s: bandwidth wins.
    assert cost.seconds(Work(pairs=1e3, kv_read=1e5)) == pytest.approx(TOY_KAPPA * 1e5 / 1e10, rel=1e-12)


def test_roofline_components_add():
    cost = CostModel(TOY, TOY_DEVICE, chunk_tokens=1000)
    dense, attention = Work(tokens=100), Work(pairs=1e5, kv_read=10)
    head = Work(answers=7, vocabulary_rows=3)
    assert cost.seconds(dense + attention) == pytest.approx(cost.seconds(dense) + cost.seconds(attention), rel=1e-12)
    # TRUE/FALSE answers read ANSWER_COLUMNS head columns; label rows read the whole vocabulary (1000 here).
    head_flops = 2 * 64 * (ANSWER_COLUMNS * 7 + 1000 * 3)
    assert cost.seconds(head) == pytest.approx(head_flops / 1e12, rel=1e-12)
    assert cost.flops(dense + attention + head) == 2 * TOY_PARAMS * 100 + TOY_PAIR_FLOPS * 1e5 + head_flops


def test_decode_like_asks_are_bandwidth_bound_and_long_scans_compute_bound_on_a_gpu():
    model = next(m for m in BUILT_IN_MODELS if m.name == "qwen3-8b")
    device = next(d for d in BUILT_IN_DEVICES if d.name == "h200")
    cost = CostModel(model, device, chunk_tokens=8192)
    one_token = ask(Lengths.of([4000]), Lengths.of([1]))
    attention_flops = 4 * model.heads * model.head_dim * model.layers * one_token.pairs
    kv_bytes = model.kv_bytes_per_token * (one_token.kv_read + one_token.kv_written)
    assert kv_bytes / device.bandwidth_bytes_per_s > attention_flops / cost.peak
    long_scan = scan(Lengths.of([8192]))
    dense_flops = 2 * model.non_embedding_params * long_scan.tokens + cost.head_flops(long_scan)
    dense_bytes = model.non_embedding_params * model.weight_bytes * long_scan.tokens / cost.chunk_tokens
    assert dense_flops / cost.peak > dense_bytes / device.bandwidth_bytes_per_s


def test_fp8_models_use_the_fp8_peak_where_the_device_has_one():
    fp8 = next(m for m in BUILT_IN_MODELS if m.name == "qwen3-4b-fp8")
    bf16 = next(m for m in BUILT_IN_MODELS if m.name == "qwen3-4b")
    h200 = next(d for d in BUILT_IN_DEVICES if d.name == "h200")
    a100 = next(d for d in BUILT_IN_DEVICES if d.name == "a100-80gb")
    assert precision_of(fp8) == "fp8" and precision_of(bf16) == "bf16"
    assert CostModel(fp8, h200, 2048).peak == h200.peak_fp8_flops
    assert CostModel(fp8, a100, 2048).peak == a100.peak_bf16_flops
    assert CostModel(bf16, h200, 2048).peak == h200.peak_bf16_flops


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(BUILT_IN_MODELS), st.sampled_from(BUILT_IN_DEVICES), st.sampled_from([64, 512, 2048, 32768]),
    st.lists(st.integers(1, 4000), min_size=1, max_size=20), st.integers(1, 64), st.integers(2, 50),
)
def test_costs_scale_linearly_with_document_count(model, device, chunk, lengths, question, copies):
    cost = CostModel(model, device, chunk)
    once, many = Lengths.of(lengths), Lengths.of(lengths * copies)
    questions = Lengths(once.count, once.count * question, once.count * question**2, question)
    for work_once, work_many in (
        (scan(once), scan(many)),
        (ask(once, questions), ask(many, questions.scaled(copies))),
        (stream(once, [questions, questions]), stream(many, [questions.scaled(copies)] * 2)),
    ):
        for field in ("tokens", "pairs", "kv_read", "kv_written", "answers"):
            assert getattr(work_many, field) == pytest.approx(copies * getattr(work_once, field), rel=1e-12)
        assert cost.seconds(work_many) == pytest.approx(copies * cost.seconds(work_once), rel=1e-12)
        assert cost.seconds(work_once.times(copies)) == pytest.approx(copies * cost.seconds(work_once), rel=1e-12)
