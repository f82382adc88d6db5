"""Request planning: the native planner's decisions, folded into one RequestExecution node.

The filter order, join order, anchors and prompt ids come from `quail.planner.physical.plan_query`
— the same search the native backend runs — so a comparison between backends compares execution,
never planning. The model steps and the Recombine / HashJoin steps between them move into the
node; the Scans, the outer equality pairs, Limit and Project stay in the generic runtime.
"""

from __future__ import annotations

from dataclasses import replace

from quail.backends.base import ModelRegion, PhysicalCandidate, PlanningContext
from quail.errors import Refusal
from quail.frontend.prompts import PromptStyle, answer_tokens
from quail.logical.expressions import Equality
from quail.physical import nodes as ph
from quail.physical.graph import Edge, PhysicalGraph
from quail.planner.calibration import calibrates
from quail.planner.physical import plan_query
from quail.requests.node import EqualityPairs, RequestExecution, RequestStrategy

REQUESTS_ID = "requests"
_OUTER = (ph.Scan, ph.Limit, ph.Project)
_INNER = (ph.AiFilter, ph.AiJoin, ph.AiScore, ph.HashJoin, ph.RecombineFilter, ph.RecombineJoin, ph.RecombineScores,
          ph.RecombineVerdicts, ph.DropNullDocuments)


def plan_requests(backend: str, region: ModelRegion, context: PlanningContext, style: PromptStyle,
                  strategy: RequestStrategy) -> PhysicalCandidate | Refusal:
    """The native plan of `region`, with every model step run as requests; a Refusal for what cannot be."""
    if context.tokenizer is None:
        return Refusal("request planning needs the model's tokenizer, and none was given")
    labels = answer_tokens(context.tokenizer)  # refuses a tokenizer that cannot tell TRUE from FALSE
    native = plan_query(backend, region, context, style, calibrate=calibrates(context))
    refusal = _refusal(native.graph)
    if refusal is not None:
        return refusal
    graph = fold(native.graph, replace(_EMPTY, strategy=strategy, labels=labels, estimate=ph.NodeEstimate(
        seconds=native.estimated_seconds)))
    graph.validate()
    return replace(native, graph=graph)


def _refusal(graph: PhysicalGraph) -> Refusal | None:
    for node in graph.nodes:
        if isinstance(node, ph.AiClassify):
            return Refusal(
                "the request backends do not run AI.CLASSIFY",
                (f"{node.describe()}: a label's score is the summed log-probability of its whole continuation, "
                 "which one TRUE/FALSE request per document cannot read",),
                hints=("run classification on the native backend",),
            )
        if not isinstance(node, _OUTER + _INNER):
            return Refusal(f"the request backends cannot run {node.kind} {node.id!r}")
    return None


_EMPTY = RequestExecution(REQUESTS_ID)


def fold(graph: PhysicalGraph, template: RequestExecution) -> PhysicalGraph:
    """Scans → RequestExecution (with outer HashJoins for equality pairs) → [Limit] → Project.

    `template` carries what the native graph does not: the strategy, the answer tokens, the estimate.
    """
    order = graph.topological_order()
    scans = [n for n in order if isinstance(n, ph.Scan)]
    tail = _tail(graph)
    inner = [n for n in order if isinstance(n, _INNER)]
    inner_ids = {n.id for n in inner}
    result = graph.inputs_of(tail[-1].id)["rows"].source
    pairs = _pairs(inner)
    node = replace(template, aliases=tuple(s.alias for s in scans), steps=tuple(inner),
                   edges=tuple(e for e in graph.edges if e.target in inner_ids), result=result, pairs=pairs)
    nodes: list[ph.PhysicalNode] = [*scans]
    edges = [Edge(s.id, "rows", REQUESTS_ID, s.id) for s in scans]
    for pair in pairs:
        left, right = pair.equality.left.alias, pair.equality.right.alias
        nodes.append(ph.HashJoin(pair.port, equalities=(pair.equality,)))
        edges += [Edge(f"scan_{left}", "rows", pair.port, "left"), Edge(f"scan_{right}", "rows", pair.port, "right"),
                  Edge(pair.port, "rows", REQUESTS_ID, pair.port)]
    nodes.append(node)
    source = REQUESTS_ID
    for outer in reversed(tail):
        nodes.append(outer)
        edges.append(Edge(source, "rows", outer.id, "rows"))
        source = outer.id
    return PhysicalGraph(tuple(nodes), tuple(edges), graph.root)


def _tail(graph: PhysicalGraph) -> list[ph.PhysicalNode]:
    """Project, then the Limits under it, from the root down."""
    chain = [graph.node(graph.root)]
    while True:
        below = graph.node(graph.inputs_of(chain[-1].id)["rows"].source)
        if not isinstance(below, ph.Limit):
            return chain
        chain.append(below)


def _pairs(inner: list[ph.PhysicalNode]) -> tuple[EqualityPairs, ...]:
    seen: list[Equality] = []
    for node in inner:
        if isinstance(node, ph.HashJoin):
            seen.extend(e for e in node.equalities if e not in seen)
    return tuple(EqualityPairs(f"pairs_{k}", equality) for k, equality in enumerate(seen))
