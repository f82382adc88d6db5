"""The physical planner: an optimized logical plan → a typed graph of model and Arrow nodes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from quail.backends.base import ModelRegion, PhysicalCandidate, PlanningContext
from quail.data.tokenizer import Tokenizer
from quail.logical.expressions import AiPredicate, PairCondition
from quail.logical.nodes import (
    Classify,
    Generate,
    Join,
    LogicalNode,
    Project,
    Scan,
    Score,
    SemanticFilter,
    SemanticJoin,
    Verdict,
    walk,
)
from quail.physical import nodes as ph
from quail.physical.graph import Edge, PhysicalGraph
from quail.planner.calibration import REMARK as CALIBRATION_REMARK
from quail.planner.filters import selectivity_of
from quail.planner.optimizer import Decisions, optimize
from quail.prompts import (
    AnswerTokens,
    ExamplesLayout,
    PromptStyle,
    bind_classify,
    bind_filters,
    bind_generate,
    bind_join,
    content_free_documents,
)

Port = tuple[str, str]


def plan_query(backend: str, region: ModelRegion, context: PlanningContext, style: PromptStyle,
               calibrate: bool = False, answers: AnswerTokens | None = None) -> PhysicalCandidate:
    """Optimize the region's plan and lay it out as model nodes the backend runs one by one.

    `calibrate` gives every filter and join the content-free documents its decisions are measured against;
    `answers` the TRUE/FALSE token ids their margins are read from (for backends that need them in the plan).
    """
    optimized = optimize(region.root, context, style)
    assert context.tokenizer is not None
    calibration = content_free_documents(context.tokenizer) if calibrate else ()
    rows = {alias: len(lengths) + context.null_documents.get(alias, 0)
            for alias, lengths in context.document_token_lengths.items()}
    builder = _GraphBuilder(context.tokenizer, style, optimized.decisions, calibration, answers,
                            frozenset(a for a, n in context.null_documents.items() if n), rows)
    graph = builder.build(optimized.logical, context.join_conditions != "off")
    graph.validate()
    decisions = optimized.decisions
    remarks = decisions.remarks + ((CALIBRATION_REMARK,) if calibrate else ()) + optimized.logical.remarks
    return PhysicalCandidate(backend, graph, optimized.logical, decisions.estimated_seconds, decisions.sol_seconds,
                             remarks)


@dataclass
class _GraphBuilder:
    tokenizer: Tokenizer
    style: PromptStyle
    decisions: Decisions
    calibration: tuple[ph.TokenIds, ...] = ()
    answers: AnswerTokens | None = None
    null_documents: frozenset[str] = frozenset()
    """Aliases with a NULL document somewhere: the model's inputs skip those rows."""
    scan_rows: Mapping[str, int] = field(default_factory=dict)
    """Per alias: the rows its scan keeps (shown on the plan's Scan nodes)."""
    nodes: list[ph.PhysicalNode] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    join_order: list[int] = field(default_factory=list)
    nullable: set[str] = field(default_factory=set)
    """Aliases whose row is NULL where a LEFT JOIN found no partner."""
    pair_conditions: tuple[PairCondition, ...] = ()
    """The query's conditions over two tables' columns: a join between them asks only the pairs that pass."""
    readers: dict[str, int] = field(default_factory=dict)
    """Per alias: the AI outputs over its documents (labels, scores, values, generations) in the document-first
    layout not laid out yet — the ones that run later and read a document's KV an earlier node kept."""

    def anchored_again(self, position: int, anchor: str) -> bool:
        """Whether a join that runs after this one anchors on the same alias (its KV is then kept)."""
        later = self.join_order[self.join_order.index(position) + 1:]
        return any(self.decisions.anchors.get(p) == anchor for p in later)

    def read_later(self, alias: str, layout: ExamplesLayout = "document_first") -> bool:
        """Whether an AI output over `alias` runs after the node laid out now and reads its documents' KV: it is
        then kept for it. Only in the document-first layout is a document's KV the same for every node (its
        preamble holds no examples)."""
        return layout == "document_first" and self.readers.get(alias, 0) > 0

    def reading(self, node: Classify | Score | Verdict | Generate) -> str:
        """The output's alias, no longer counted among the readers still to come (it is being laid out)."""
        alias = node.prompt.aliases[0]
        if self.reads_document_first(node):
            self.readers[alias] -= 1
        return alias

    def reads_document_first(self, node: Classify | Score | Verdict | Generate) -> bool:
        return isinstance(node, Generate) or self.decisions.layout(("output", node.position)) == "document_first"

    def add(self, node: ph.PhysicalNode, **inputs: Port) -> str:
        self.nodes.append(node)
        for port, (source, source_port) in inputs.items():
            self.edges.append(Edge(source, source_port, node.id, port))
        return node.id

    def build(self, plan: Project, join_conditions: bool = True) -> PhysicalGraph:
        self.pair_conditions = plan.pair_conditions if join_conditions else ()
        self.join_order = [n.predicate.position for n in reversed(walk(plan)) if isinstance(n, SemanticJoin)]
        for node in walk(plan):
            if isinstance(node, Classify | Score | Verdict | Generate) and self.reads_document_first(node):
                alias = node.prompt.aliases[0]
                self.readers[alias] = self.readers.get(alias, 0) + 1
        rows = self.rows(plan.child)
        if plan.limit is not None:
            rows = (self.add(ph.Limit("limit", count=plan.limit), rows=rows), "rows")
        root = self.add(ph.Project("project", columns=plan.columns, statement=plan.statement,
                                   relations=plan.relations), rows=rows)
        return PhysicalGraph(tuple(self.nodes), tuple(self.edges), root)

    def documents(self, rows: Port, aliases: tuple[str, ...], distinct: bool = False) -> Port:
        """`rows` as a model node's input: without the rows whose document of `aliases` is NULL, if any can be;
        `distinct`: each document of the one alias once (rows repeat it after a join)."""
        skipped = tuple(a for a in aliases if a in self.null_documents or a in self.nullable)
        if not skipped and not distinct:
            return rows
        name = f"documents_{'_'.join(aliases if distinct else skipped)}"
        count = sum(1 for n in self.nodes if n.id == name or n.id.startswith(f"{name}_"))
        node_id = name if count == 0 else f"{name}_{count}"
        node = ph.DropNullDocuments(node_id, aliases=aliases if distinct else skipped, distinct=distinct)
        return self.add(node, rows=rows), "rows"

    def rows(self, node: LogicalNode) -> Port:
        if isinstance(node, Scan):
            rows = self.scan_rows.get(node.alias)
            return self.add(ph.Scan(f"scan_{node.alias}", ph.NodeEstimate(rows=rows), table=node.table,
                                    alias=node.alias, where=node.where or "")), "rows"
        if isinstance(node, SemanticFilter):
            return self.filter(node)
        if isinstance(node, SemanticJoin):
            return self.semantic_join(node)
        if isinstance(node, Join):
            left, right = self.rows(node.left), self.rows(node.right)
            name = f"hashjoin_{'_'.join(node.right.aliases)}"
            return self.add(ph.HashJoin(name, equalities=node.equalities), left=left, right=right), "rows"
        if isinstance(node, Classify):
            return self.classify(node)
        if isinstance(node, Score):
            return self.score(node)
        if isinstance(node, Verdict):
            return self.verdict(node)
        if isinstance(node, Generate):
            return self.generate(node)
        raise TypeError(f"no physical operator for {type(node).__name__}")

    def filter(self, node: SemanticFilter) -> Port:
        rows = self.rows(node.child)
        bound = bind_filters(node.predicates, self.tokenizer, self.style, self.decisions.layout(("filter", node.alias)))
        stages = tuple(ph.FilterStage(p, q, *selectivity_of(p.selectivity))
                       for p, q in zip(node.predicates, bound.questions, strict=True))
        order = self.decisions.filter_orders.get(node.alias)
        estimate = ph.NodeEstimate(rows=None, seconds=order.seconds if order else None)
        model = self.add(ph.AiFilter(f"filter_{node.alias}", estimate, alias=node.alias, column=bound.column,
                                     preamble=bound.preamble, frame=bound.frame, stages=stages,
                                     retain_kv=node.alias in self.decisions.retained or self.read_later(
                                         node.alias, self.decisions.layout(("filter", node.alias))),
                                     share_prefixes=node.alias in self.decisions.shared_prefixes,
                                     calibration=self.calibration, answers=self.answers),
                         rows=self.documents(rows, (node.alias,)))
        return self.add(ph.RecombineFilter(f"survivors_{node.alias}", alias=node.alias),
                        rows=rows, answers=(model, "answers")), "rows"

    def semantic_join(self, node: SemanticJoin) -> Port:
        left, right = self.rows(node.left), self.rows(node.right)
        predicate = node.predicate
        anchor = self.decisions.anchors.get(predicate.position, predicate.anchor) or predicate.aliases[0]
        bound = bind_join(predicate, anchor, self.tokenizer, self.style)
        read = predicate.aliases
        inputs: dict[str, Port] = {"left": self.documents(left, _within(read, node.left.aliases)),
                                   "right": self.documents(right, _within(read, node.right.aliases))}
        recombined: dict[str, Port] = {}
        conditions = (*node.conditions,
                      *(c for c in self.pair_conditions if node.semantics == "full" and _across(c, node)))
        if node.equalities or conditions:
            pairs = self.add(ph.HashJoin(f"candidates_{predicate.position}", equalities=node.equalities,
                                         conditions=conditions), left=inputs["left"], right=inputs["right"])
            inputs["candidates"] = recombined["candidates"] = (pairs, "rows")
        selectivity, assumed = selectivity_of(predicate.selectivity)
        # A LEFT join evaluates every candidate, as a full one does; only its recombination differs. So does
        # an EXISTS whose equalities read an alias the predicate does not: whether a left row has a TRUE
        # partner then depends on more than the anchor, so no anchor may stop at its first TRUE.
        beyond = any(a not in read for e in node.equalities for a in e.aliases)
        semantics = "full" if node.semantics == "left" or beyond else node.semantics
        model = self.add(ph.AiJoin(f"join_{predicate.position}", self.join_estimate(predicate.position),
                                   predicate=predicate, anchor=bound.anchor, partners=bound.partners,
                                   semantics=semantics, preamble=bound.preamble, frame=bound.frame,
                                   labels=bound.labels, cue=bound.cue, selectivity=selectivity,
                                   assumed_selectivity=assumed,
                                   retain_anchor_kv=self.anchored_again(predicate.position, anchor),
                                   share_prefixes=anchor in self.decisions.shared_prefixes,
                                   calibration=self.calibration, answers=self.answers), **inputs)
        if node.semantics == "left":
            self.nullable.update(node.right.aliases)
        return self.add(ph.RecombineJoin(f"joined_{predicate.position}", semantics=node.semantics),
                        left=left, right=right, answers=(model, "answers"), **recombined), "rows"

    def join_estimate(self, position: int) -> ph.NodeEstimate:
        plan = self.decisions.join_plan
        for step in plan.steps if plan else ():
            if step.edge == position:
                return ph.NodeEstimate(rows=step.tuples_after, tokens=step.work.tokens, seconds=step.seconds)
        return ph.NodeEstimate()

    def classify(self, node: Classify) -> Port:
        rows = self.rows(node.child)
        alias = self.reading(node)
        layout = self.decisions.layout(("output", node.position))
        bound = bind_classify(node.prompt, node.labels, node.instructions, self.tokenizer, self.style, layout)
        model = self.add(ph.AiClassify(f"classify_{node.output}", alias=alias, column=bound.column,
                                       output=node.output, position=node.position, labels=node.labels,
                                       preamble=bound.preamble, tail=bound.tail, label_tokens=bound.labels,
                                       retain_kv=self.read_later(alias, layout)),
                         rows=self.documents(rows, (alias,), len(node.child.aliases) > 1))
        return self.add(ph.RecombineLabels(f"labels_{node.output}", alias=alias, output=node.output,
                                           allowed=node.allowed), rows=rows, answers=(model, "answers")), "rows"

    def score(self, node: Score) -> Port:
        rows = self.rows(node.child)
        alias = self.reading(node)
        layout = self.decisions.layout(("output", node.position))
        bound = bind_filters([AiPredicate(node.prompt, node.position)], self.tokenizer, self.style, layout)
        model = self.add(ph.AiScore(f"score_{node.output}", alias=alias, column=bound.column, output=node.output,
                                    position=node.position, prompt=node.prompt, preamble=bound.preamble,
                                    question=bound.frame + bound.questions[0], answers=self.answers,
                                    retain_kv=self.read_later(alias, layout)),
                         rows=self.documents(rows, (alias,), len(node.child.aliases) > 1))
        return self.add(ph.RecombineScores(f"scores_{node.output}", alias=alias, output=node.output),
                        rows=rows, answers=(model, "answers")), "rows"

    def generate(self, node: Generate) -> Port:
        rows = self.rows(node.child)
        alias = self.reading(node)
        bound = bind_generate(node.prompt, self.tokenizer, self.style, node.schema)
        model = self.add(ph.AiGenerate(f"generate_{node.output}", alias=alias, column=bound.column,
                                       output=node.output, position=node.position, prompt=node.prompt,
                                       preamble=bound.preamble, tail=bound.tail, max_tokens=node.max_tokens,
                                       stop=bound.stop, schema=node.schema,
                                       retain_kv=self.read_later(alias)),
                         rows=self.documents(rows, (alias,), len(node.child.aliases) > 1))
        return self.add(ph.RecombineTexts(f"texts_{node.output}", alias=alias, output=node.output,
                                          schema=node.schema),
                        rows=rows, answers=(model, "answers")), "rows"

    def verdict(self, node: Verdict) -> Port:
        """AI_FILTER as a value: a one-stage AiFilter (it answers every row) whose answers become a column."""
        rows = self.rows(node.child)
        alias = self.reading(node)
        predicate = AiPredicate(node.prompt, node.position, node.selectivity)
        layout = self.decisions.layout(("output", node.position))
        bound = bind_filters([predicate], self.tokenizer, self.style, layout)
        stage = ph.FilterStage(predicate, bound.questions[0], *selectivity_of(node.selectivity))
        later = self.read_later(alias, layout)
        model = self.add(ph.AiFilter(f"filter_{node.output}", alias=alias, column=bound.column,
                                     preamble=bound.preamble, frame=bound.frame, stages=(stage,),
                                     retain_kv=later, retain_all=later,
                                     calibration=self.calibration, answers=self.answers),
                         rows=self.documents(rows, (alias,), len(node.child.aliases) > 1))
        return self.add(ph.RecombineVerdicts(f"verdicts_{node.output}", alias=alias, output=node.output),
                        rows=rows, answers=(model, "answers")), "rows"


def _within(read: tuple[str, ...], side: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a for a in read if a in side)


def _across(condition: PairCondition, join: SemanticJoin) -> bool:
    """Whether a join meets the condition's two tables, one on each side."""
    first, second = condition.aliases
    left, right = set(join.left.aliases), set(join.right.aliases)
    return (first in left and second in right) or (first in right and second in left)
