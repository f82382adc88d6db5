"""Cost-based decisions on a logical plan: filter order per alias, join order and anchors, KV kept.

The result is the rewritten logical plan plus the decisions and their estimates, in words too, so
explain() can say what was chosen and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from quail.backends.base import PlanningContext
from quail.data.tokenizer import Tokenizer
from quail.errors import Refusal, RefusalError
from quail.logical.expressions import AiPredicate, Prompt, Semantics
from quail.logical.nodes import AiOutput, Classify, Generate, LogicalNode, Project
from quail.planner.cost import CostModel, Lengths, Work, ask, decode, scan
from quail.planner.examples import LayoutKey, choose_layout
from quail.planner.filters import FilterOrder, StagePrice, order_filters, selectivity_of
from quail.planner.joins import (
    EXHAUSTIVE_JOIN_LIMIT,
    AliasStats,
    AnchorLayout,
    EqualityEdge,
    JoinEdge,
    JoinPlan,
    JoinProblem,
    plan_joins,
)
from quail.planner.shape import Leaf, PlanShape, SubqueryJoin, rebuild, shape_of
from quail.planner.stored import StoredPrices
from quail.prompts import (
    ExamplesLayout,
    PromptStyle,
    bind_classify,
    bind_filters,
    bind_generate,
    bind_join,
    filter_tail,
    tail_ids,
)

OVERSIZED_HINT = ("to answer the other documents, skip or cut the long ones: "
                  "EngineConfig(oversized_documents='skip' or 'truncate')")


@dataclass(frozen=True)
class Decisions:
    """What the planner chose, with its estimates (seconds on the configured device)."""

    filter_orders: Mapping[str, FilterOrder]
    join_plan: JoinPlan | None
    anchors: Mapping[int, str]
    retained: frozenset[str]
    shared_prefixes: frozenset[str]
    filter_seconds: float
    join_seconds: float
    output_seconds: float
    sol_seconds: float
    assumed: tuple[int, ...]
    remarks: tuple[str, ...]
    layouts: Mapping[LayoutKey, ExamplesLayout] = field(default_factory=dict)
    """Where each node's few-shot examples go (`planner.examples`); a node not named has none."""

    def layout(self, key: LayoutKey) -> ExamplesLayout:
        return self.layouts.get(key, "document_first")

    @property
    def estimated_seconds(self) -> float:
        return self.filter_seconds + self.join_seconds + self.output_seconds


@dataclass(frozen=True)
class OptimizedPlan:
    logical: Project
    decisions: Decisions


def optimize(plan: LogicalNode, context: PlanningContext, style: PromptStyle) -> OptimizedPlan:
    """Choose filter orders, join order and anchors for `plan`; refuse what could never run."""
    if context.tokenizer is None:
        raise RefusalError(Refusal("planning needs the model's tokenizer", ("none was given to the session",)))
    return _Optimizer(shape_of(plan), context, context.tokenizer, style).run()


class _Optimizer:
    def __init__(self, shape: PlanShape, context: PlanningContext, tokenizer: Tokenizer, style: PromptStyle) -> None:
        self.shape = shape
        self.context = context
        self.tokenizer = tokenizer
        self.style = style
        self.cost = CostModel(context.model, context.device, context.chunk_tokens)
        self.remarks: list[str] = []
        self.stored = StoredPrices(context, tokenizer, style, self.remarks)
        self.layouts: dict[LayoutKey, ExamplesLayout] = {}

    def documents(self, alias: str) -> Lengths:
        lengths = self.context.document_token_lengths.get(alias)
        if lengths is None:
            raise RefusalError(Refusal(f"no document token lengths for alias {alias!r}"))
        return Lengths.of(list(lengths))

    # -- the pipeline -------------------------------------------------------------------------

    def choose_layouts(self, leaves: list[Leaf]) -> None:
        """Each node's examples layout, before anything is priced: every price below reads it."""
        joined = {a for p in (*self.shape.join_predicates, *(s.predicate for s in self.shape.subqueries))
                  for a in p.aliases}
        nodes: list[tuple[LayoutKey, str, list[Prompt], str]] = [
            (("filter", leaf.alias), leaf.alias, [p.prompt for p in leaf.predicates], f"the filters on {leaf.alias}")
            for leaf in leaves if leaf.predicates]
        nodes += [(("output", o.position), o.prompt.aliases[0], [o.prompt], f"{o.output} ({type(o).__name__} on "
                   f"{o.prompt.aliases[0]})") for o in self.shape.outputs if not isinstance(o, Generate)]
        for key, alias, prompts, what in nodes:
            documents = self.documents(alias)
            choice = choose_layout(prompts, documents.count, documents.total, alias in joined and key[0] == "filter",
                                   self.tokenizer, what, self.context.question_first)
            self.layouts[key] = choice.layout
            if choice.remark:
                self.remarks.append(choice.remark)

    def run(self) -> OptimizedPlan:
        leaves = [*self.shape.leaves, *(s.leaf for s in self.shape.subqueries)]
        self.choose_layouts(leaves)
        orders = {leaf.alias: self.filter_order(leaf) for leaf in leaves if leaf.predicates}
        shared = frozenset(alias for alias, order in orders.items() if self.share_prefixes(alias, order))
        orders = {alias: self.with_sharing(order) if alias in shared else order for alias, order in orders.items()}
        stats = self.alias_stats(leaves, orders)
        retained = self.retention(stats, orders)
        problem = self.join_problem(stats, retained)
        join_plan = self.join_plan(problem)
        anchors = dict(join_plan.anchors) if join_plan else {}
        semi_seconds = self.subquery_anchors(problem, join_plan, anchors)
        shared |= frozenset(a for a in set(anchors.values()) - shared if self.share_anchor_prefixes(a))
        output_seconds = sum(self.output_seconds(o, stats) for o in self.shape.outputs)
        filter_seconds = sum(o.seconds for o in orders.values())
        join_seconds = (join_plan.seconds if join_plan else 0.0) + semi_seconds
        sol = filter_seconds + self.sol_join_seconds(stats, join_plan, anchors) + output_seconds
        used_retention = frozenset(a for a in retained if a in anchors.values())
        decisions = Decisions(orders, join_plan, anchors, used_retention, shared, filter_seconds, join_seconds,
                              output_seconds, min(sol, filter_seconds + join_seconds + output_seconds),
                              self.assumed(), tuple(self.remarks + self.retention_remarks(used_retention, stats)),
                              dict(self.layouts))
        return OptimizedPlan(self.rewrite(orders, join_plan, anchors), decisions)

    def assumed(self) -> tuple[int, ...]:
        predicates = [*self.shape.join_predicates, *(s.predicate for s in self.shape.subqueries)]
        for leaf in (*self.shape.leaves, *(s.leaf for s in self.shape.subqueries)):
            predicates.extend(leaf.predicates)
        return tuple(sorted(p.position for p in predicates if p.selectivity is None))

    # -- filters ------------------------------------------------------------------------------

    def filter_order(self, leaf: Leaf) -> FilterOrder:
        bound = bind_filters(leaf.predicates, self.tokenizer, self.style, self.layouts[("filter", leaf.alias)])
        documents = self.documents(leaf.alias)
        prefix = documents.plus(len(bound.preamble) + len(bound.frame))
        text = len(bound.preamble) + len(bound.frame) + max(len(q) for q in bound.questions)
        self.check_examples_fit(leaf.alias, text, [p.prompt for p in leaf.predicates])
        self.check_fits(leaf.alias, prefix.maximum + max(len(q) for q in bound.questions))
        prices = []
        pending = self.stored.pending_stages(leaf.alias, leaf.predicates, bound, documents)
        for predicate, question, todo in zip(leaf.predicates, bound.questions, pending, strict=True):
            selectivity, assumed = selectivity_of(predicate.selectivity)
            asked = todo.plus(len(bound.preamble) + len(bound.frame))
            questions = _constant(todo.count, len(question))
            prices.append(StagePrice(
                predicate.position, selectivity, assumed,
                self.cost.seconds(scan(asked.plus(len(question)))),
                self.cost.seconds(ask(asked, questions)),
            ))
        order = order_filters(leaf.alias, prices, self.context.order_rule)
        self.remarks.append(f"filter order on {leaf.alias}: {' → '.join(f'#{p}' for p in order.positions)} "
                            f"({order.reason})")
        return order

    def sharing_seconds(self, alias: str, order: FilterOrder) -> tuple[float, float]:
        """(compute saved, KV traffic added) by borrowing the alias's shared document prefixes."""
        shared = float(self.context.document_shared_prefix_tokens.get(alias, 0))
        documents = self.documents(alias)
        saved = self.cost.seconds(Work(tokens=shared, pairs=shared * documents.mean / 2, kv_written=shared))
        writes = documents.total if len(order.positions) == 1 else 0.0
        return saved, self.cost.seconds(Work(kv_written=writes, kv_read=shared))

    def share_prefixes(self, alias: str, order: FilterOrder) -> bool:
        """Borrow neighbours' prefixes where the compute saved beats the KV written — never under LIMIT."""
        switch = self.context.prefix_sharing
        if switch == "off" or not self.context.document_shared_prefix_tokens.get(alias):
            return False
        if self.shape.project.limit is not None:
            self.remarks.append(f"no prefix sharing on {alias}: the query has a LIMIT (sorting would change "
                                f"which documents are evaluated first)")
            return False
        saved, added = self.sharing_seconds(alias, order)
        if switch == "auto" and saved <= added:
            return False
        shared = self.context.document_shared_prefix_tokens[alias]
        self.remarks.append(f"share document prefixes on {alias}: {shared:,} tokens borrowed from neighbours "
                            f"in token order (saves ≈{saved:.3g} s of compute for ≈{added:.3g} s of KV traffic)")
        return True

    def share_anchor_prefixes(self, alias: str) -> bool:
        """Join anchors borrow the prefixes they share — never under LIMIT. An anchor's KV is computed and
        held for its partners either way, so borrowing only saves compute: on unless switched off."""
        shared = self.context.document_shared_prefix_tokens.get(alias)
        if self.context.prefix_sharing == "off" or not shared or self.shape.project.limit is not None:
            return False
        self.remarks.append(f"join anchors on {alias} borrow shared document prefixes: {shared:,} tokens "
                            "from anchors in token order")
        return True

    def with_sharing(self, order: FilterOrder) -> FilterOrder:
        saved, added = self.sharing_seconds(order.alias, order)
        return replace(order, seconds=max(order.seconds - saved + added, 0.0))

    def check_examples_fit(self, what: str, text: int, prompts: list[Prompt]) -> None:
        """A prompt whose own text — its examples, mostly — leaves no room for a document: refused naming the
        examples (skipping or cutting documents, the oversized-document remedy, could not help)."""
        budget = min(self.context.chunk_tokens, self.context.model.context_length)
        examples = sum(len(prompt.examples) for prompt in prompts)
        if examples and text >= budget:
            raise RefusalError(Refusal(
                f"the examples of the prompts over {what} leave no room for a document in one forward pass",
                (f"{examples} example{'s' if examples > 1 else ''} and the question take {text:,} tokens",),
                needed=text + 1, available=budget, unit="tokens",
                hints=("give fewer or shorter examples", "or raise EngineConfig.chunk_tokens"),
            ))

    def check_fits(self, what: str, longest: float) -> None:
        budget = min(self.context.chunk_tokens, self.context.model.context_length)
        if longest > budget:
            limit = "forward chunk" if self.context.chunk_tokens <= self.context.model.context_length else "context"
            raise RefusalError(Refusal(
                f"a prompt over {what} does not fit one {limit}",
                ("a document plus its question must fit one forward pass",),
                needed=longest, available=budget, unit="tokens", hints=(OVERSIZED_HINT,),
            ))

    def alias_stats(self, leaves: list[Leaf], orders: Mapping[str, FilterOrder]) -> dict[str, AliasStats]:
        stats = {}
        for leaf in leaves:
            survival = orders[leaf.alias].survival if leaf.alias in orders else 1.0
            stats[leaf.alias] = AliasStats(leaf.alias, self.documents(leaf.alias).scaled(survival))
        return stats

    def retention(self, stats: dict[str, AliasStats], orders: Mapping[str, FilterOrder]) -> frozenset[str]:
        """Filtered aliases keep their survivors' document KV for a join (evicted by priority if pages run short) —
        unless the filters' examples went first: their documents' KV then holds the examples, which a join's
        prompt does not."""
        kept = frozenset(a for a in orders if self.layouts.get(("filter", a), "document_first") == "document_first")
        for alias in kept:
            stats[alias] = replace(stats[alias], kv_retained=True)
        return kept

    def retention_remarks(self, used: frozenset[str], stats: Mapping[str, AliasStats]) -> list[str]:
        remarks = []
        budget = self.context.kv_budget_bytes
        for alias in sorted(used):
            needed = stats[alias].documents.total * self.context.model.kv_bytes_per_token
            overflow = "" if budget is None or needed <= budget else (
                f" (≈{needed / 2**20:.3g} MiB expected, over the {budget / 2**20:.3g} MiB arena: the lowest-priority "
                f"documents are evicted and recomputed)")
            remarks.append(f"keep the document KV of {alias}'s filter survivors for the join anchored on {alias}"
                           f"{overflow}")
        return remarks

    # -- joins --------------------------------------------------------------------------------

    def join_problem(self, stats: dict[str, AliasStats], retained: frozenset[str]) -> JoinProblem:
        edges = [self.join_edge(p, "full") for p in self.shape.join_predicates]
        edges += [self.join_edge(s.predicate, s.semantics) for s in self.shape.subqueries]
        fractions = self.context.equality_pair_fractions
        equalities = []
        for equality in (*self.shape.equalities, *(e for s in self.shape.subqueries for e in s.equalities)):
            pair = equality.aliases
            fraction = fractions.get(pair, fractions.get((pair[1], pair[0]), 1.0))
            equalities.append(EqualityEdge(pair, fraction))
        return JoinProblem(stats, tuple(edges), tuple(equalities), self.cost)

    def join_edge(self, predicate: AiPredicate, semantics: Semantics) -> JoinEdge:
        """A LEFT join evaluates every candidate pair, as a full join does: it is priced as one."""
        anchors = [predicate.anchor] if predicate.anchor else sorted(set(predicate.aliases))
        layouts = {}
        for anchor in anchors:
            bound = bind_join(predicate, anchor, self.tokenizer, self.style)
            labels = {p.alias: len(label) for p, label in zip(bound.partners, bound.labels, strict=True)}
            layouts[anchor] = AnchorLayout(len(bound.preamble), len(bound.frame), labels, len(bound.cue),
                                           self.stored.join_share(predicate.position, bound))
        selectivity, _ = selectivity_of(predicate.selectivity)
        return JoinEdge(predicate.position, predicate.aliases, selectivity, layouts,
                        "full" if semantics == "left" else semantics)

    def join_plan(self, problem: JoinProblem) -> JoinPlan | None:
        aliases = self.shape.aliases
        if len(aliases) < 2:
            return None
        full = JoinProblem(problem.stats, tuple(e for e in problem.edges if e.semantics == "full"),
                           problem.equalities, problem.cost)
        plan = plan_joins(full, aliases)
        if plan is None:
            raise RefusalError(Refusal(
                "no join order can run: every anchor's worst tuple exceeds one forward chunk",
                needed=self.shortest_worst_tuple(full), available=self.context.chunk_tokens, unit="tokens",
                hints=(OVERSIZED_HINT,),
            ))
        anchors = ", ".join(f"#{k} on {v}" for k, v in sorted(plan.anchors.items()))
        if plan.search == "greedy":
            how = (f"greedy order: {len(aliases)} tables are more than the exhaustive search's "
                   f"{EXHAUSTIVE_JOIN_LIMIT}, so the order may not be the cheapest")
        else:
            how = "cheapest of every left-deep order × anchor"
        self.remarks.append(f"join order {' ⋈ '.join(plan.order)}; anchors {anchors or 'none'} "
                            f"({how}, {plan.seconds:.3g} s)")
        return plan

    def subquery_anchors(self, problem: JoinProblem, plan: JoinPlan | None, anchors: dict[int, str]) -> float:
        joined = frozenset(self.shape.aliases)
        anchored = frozenset(anchors.values())
        total = 0.0
        for subquery in self.shape.subqueries:
            edge = next(e for e in problem.edges if e.position == subquery.predicate.position)
            single = JoinProblem(problem.stats, (edge,), problem.equalities, problem.cost)
            options = []
            for anchor in sorted(edge.layouts):
                step = single.step(joined, subquery.leaf.alias, anchor, anchored)
                if step is not None:
                    options.append((step.seconds, anchor))
            if not options:
                raise RefusalError(Refusal(f"the {subquery.semantics} join #{edge.position} fits no forward chunk",
                                           needed=self.shortest_worst_tuple(single),
                                           available=self.context.chunk_tokens, unit="tokens",
                                           hints=(OVERSIZED_HINT,)))
            seconds, anchor = min(options)
            anchors[edge.position] = anchor
            total += seconds
            self.remarks.append(f"{subquery.semantics} join #{edge.position} anchored on {anchor}")
        return total

    @staticmethod
    def shortest_worst_tuple(problem: JoinProblem) -> float:
        """The smallest chunk that would let some anchor of some join run."""
        return max(min(problem.longest_prompt(edge, anchor) for anchor in edge.layouts) for edge in problem.edges)

    def sol_join_seconds(self, stats: dict[str, AliasStats], plan: JoinPlan | None, anchors: dict[int, str]) -> float:
        """The same joins with every anchor's KV already resident: each distinct prefix once."""
        if plan is None and not self.shape.subqueries:
            return 0.0
        ideal = {a: replace(s, kv_retained=True) for a, s in stats.items()}
        problem = self.join_problem(ideal, frozenset(ideal))
        total = 0.0
        joined = frozenset([plan.order[0]]) if plan else frozenset(self.shape.aliases)
        for step in plan.steps if plan else ():
            priced = problem.step(joined, step.alias, step.anchor, frozenset(ideal))
            total += priced.seconds if priced else step.seconds
            joined = joined | {step.alias}
        for subquery in self.shape.subqueries:
            edge = next(e for e in problem.edges if e.position == subquery.predicate.position)
            single = JoinProblem(problem.stats, (edge,), problem.equalities, problem.cost)
            priced = single.step(joined, subquery.leaf.alias, anchors[edge.position], frozenset(ideal))
            total += priced.seconds if priced else 0.0
        return total

    # -- AI outputs ---------------------------------------------------------------------------

    def output_seconds(self, output: AiOutput, stats: dict[str, AliasStats]) -> float:
        """An AI output column: every document that reaches it, once (a Verdict is a one-stage filter)."""
        if isinstance(output, Generate):
            return self.generate_seconds(output, stats)
        layout = self.layouts[("output", output.position)]
        if isinstance(output, Classify):
            bound = bind_classify(output.prompt, output.labels, output.instructions, self.tokenizer, self.style,
                                  layout)
            tail, labels = len(bound.tail), [len(ids) for ids in bound.labels]
        else:
            tail = len(tail_ids(self.tokenizer, filter_tail(output.prompt, self.style, layout), self.style))
            labels = []
        alias = output.prompt.aliases[0]
        if isinstance(output, Classify):
            preamble = len(bound.preamble)
        else:
            preamble = len(bind_filters([AiPredicate(output.prompt, output.position)], self.tokenizer, self.style,
                                        layout).preamble)
        self.check_examples_fit(alias, preamble + tail + max(labels, default=0), [output.prompt])
        if layout != "document_first":  # examples / the question, once in the node's preamble: spread over documents
            tail += preamble // max(int(self.documents(alias).count), 1)
        documents = stats[alias].documents.plus(1 + tail)
        self.check_fits(alias, documents.maximum + max(labels, default=0))
        work = scan(documents)
        for length in labels:
            work = work + ask(documents, _constant(documents.count, length))
        if isinstance(output, Classify):  # label log-probabilities need the whole vocabulary head
            work = replace(work, vocabulary_rows=work.answers, answers=0.0)
        return self.cost.seconds(work.times(self.stored.output_share(output, self.documents(alias).count, layout)))

    def generate_seconds(self, output: Generate, stats: dict[str, AliasStats]) -> float:
        """Every document that reaches it, prefilled once with the instruction after it, then decoded to the token
        bound (the estimate is an upper one: a generation ends early at its end-of-text token), as many sequences
        a pass as the pass holds."""
        alias = output.prompt.aliases[0]
        bound = bind_generate(output.prompt, self.tokenizer, self.style, output.schema)
        prompts = stats[alias].documents.plus(len(bound.preamble) + len(bound.tail))
        self.check_fits(alias, prompts.maximum + output.max_tokens)
        batch = min(int(prompts.count), self.context.chunk_tokens)
        work = scan(prompts) + decode(int(prompts.count), output.max_tokens, prompts, batch)
        seconds = self.cost.seconds(work)
        self.remarks.append(f"{output.output} (Generate on {alias}): ≈{prompts.count:,.0f} documents prefilled, then "
                            f"at most {output.max_tokens} tokens each decoded {batch} sequences a pass — "
                            f"≈{seconds:.3g} s at the bound")
        return seconds

    # -- the rewritten plan -------------------------------------------------------------------

    def rewrite(self, orders: Mapping[str, FilterOrder], plan: JoinPlan | None, anchors: dict[int, str]) -> Project:
        leaves: dict[str, LogicalNode] = {}
        for leaf in (*self.shape.leaves, *(s.leaf for s in self.shape.subqueries)):
            if leaf.alias in orders:
                by_position = {p.position: p for p in leaf.predicates}
                leaves[leaf.alias] = leaf.node(tuple(by_position[i] for i in orders[leaf.alias].positions))
            else:
                leaves[leaf.alias] = leaf.node()
        predicates = {p.position: replace(p, anchor=anchors.get(p.position, p.anchor))
                      for p in self.shape.join_predicates}
        subqueries = tuple(SubqueryJoin(s.leaf, replace(s.predicate, anchor=anchors.get(s.predicate.position)),
                                        s.semantics, s.equalities, s.conditions) for s in self.shape.subqueries)
        order = plan.order if plan else self.shape.aliases
        return rebuild(self.shape, leaves, order, predicates, subqueries)


def _constant(count: float, length: int) -> Lengths:
    return Lengths(count, count * length, count * length * length, float(length))

