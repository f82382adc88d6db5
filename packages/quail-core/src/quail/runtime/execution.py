"""Planning and running a Query on its session: statistics in, candidates compared, graph run, report out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from quail.backends.base import ModelRegion, PhysicalCandidate, PlanningContext, TokenizerSource
from quail.data.tokens import TokenColumn
from quail.errors import PlanEditError, Refusal, RefusalError
from quail.logical.expressions import Equality
from quail.logical.nodes import Classify, Score, SemanticFilter, SemanticJoin, Verdict, walk
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.planner.prefixes import shareable_tokens
from quail.runtime.duckdb_tail import DuckTail
from quail.runtime.explain import explain_text
from quail.runtime.report import QueryReport, minimum_tokens, model_token_totals, null_inputs, stages
from quail.runtime.results import QueryResult
from quail.runtime.runner import RunInputs, Runner
from quail.runtime.unfold import report_view

if TYPE_CHECKING:
    from quail.session import Query


def document_columns(query: Query) -> dict[str, str]:
    """alias → the one column its prompts read (the compiler guarantees one per alias)."""
    columns: dict[str, str] = {}
    for node in walk(query.logical_plan):
        prompts = []
        if isinstance(node, SemanticFilter):
            prompts = [p.prompt for p in node.predicates]
        elif isinstance(node, SemanticJoin):
            prompts = [node.predicate.prompt]
        elif isinstance(node, Classify | Score | Verdict):
            prompts = [node.prompt]
        for prompt in prompts:
            for column in prompt.columns:
                columns[column.alias] = column.column
    return columns


def token_columns(query: Query) -> dict[str, TokenColumn]:
    session = query.session
    if session.tokenizer is None and isinstance(session.backend, TokenizerSource):
        session.tokenizer = session.backend.tokenizer(session.model)
    if session.tokenizer is None:
        raise RefusalError(Refusal(
            f"no tokenizer for model {session.model.name!r}",
            ("planning and running need the model's tokenizer: pass Session(..., tokenizer=...)",),
        ))
    views = query.views()
    return {alias: session.token_store.tokens(views[alias], column, session.tokenizer)
            for alias, column in document_columns(query).items()}


def equality_fractions(query: Query) -> dict[tuple[str, str], float]:
    """The fraction of candidate pairs each equality keeps, from the key columns' value counts."""
    fractions: dict[tuple[str, str], float] = {}
    equalities = [e for node in walk(query.logical_plan) for e in getattr(node, "equalities", ())]
    for equality in equalities:
        fractions[equality.aliases] = fractions.get(equality.aliases, 1.0) * _pair_fraction(query, equality)
    return fractions


def _pair_fraction(query: Query, equality: Equality) -> float:
    counts = []
    for ref in (equality.left, equality.right):
        provider = query.views()[ref.alias]
        counts.append(pc.value_counts(provider.to_table([ref.column]).column(ref.column).combine_chunks()))
    left = pa.table({"k": counts[0].field("values"), "a": counts[0].field("counts")})
    right = pa.table({"k": counts[1].field("values"), "b": counts[1].field("counts")})
    matched = left.join(right, "k", join_type="inner")
    pairs = pc.sum(pc.multiply(matched.column("a").cast(pa.int64()), matched.column("b").cast(pa.int64()))).as_py()
    total = pc.sum(counts[0].field("counts")).as_py() * pc.sum(counts[1].field("counts")).as_py()
    return (pairs or 0) / total if total else 0.0


def shared_prefixes(tokens: Mapping[str, TokenColumn], page_tokens: int, switch: str) -> dict[str, int]:
    """Per alias, the whole pages its documents share with a neighbour (not measured when sharing is off)."""
    if switch == "off":
        return {}
    return {alias: _shareable(column, page_tokens) for alias, column in tokens.items()}


@lru_cache(maxsize=64)
def _shareable(column: TokenColumn, page_tokens: int) -> int:
    return shareable_tokens([t for t in column.tokens.to_pylist() if t is not None], page_tokens)


def plan_physical(query: Query) -> PhysicalCandidate:
    session = query.session
    tokens = token_columns(query)
    lengths: dict[str, list[int]] = {}
    views = query.views()
    for alias in query.aliases:
        column = tokens.get(alias)
        lengths[alias] = column.present_lengths().to_pylist() if column else [0] * views[alias].num_rows
    config = session.config
    context = PlanningContext(
        model=session.model, device=session.device, gpu_count=config.gpus, document_token_lengths=lengths,
        order_rule=query.order, tokenizer=session.tokenizer, equality_pair_fractions=equality_fractions(query),
        chunk_tokens=config.chunk_tokens, kv_budget_bytes=config.kv_budget_bytes,
        kv_page_tokens=config.kv_page_tokens, prefix_sharing=config.prefix_sharing,
        document_shared_prefix_tokens=shared_prefixes(tokens, config.kv_page_tokens, config.prefix_sharing),
        calibration=config.calibration, null_documents={a: c.null_count for a, c in tokens.items()},
    )
    offered = session.backend.plan(ModelRegion(query.logical_plan), context)
    if isinstance(offered, Refusal):
        raise RefusalError(offered)
    if not offered:
        raise RefusalError(Refusal(f"backend {session.backend.name!r} offered no plan"))
    return min(offered, key=lambda c: c.estimated_seconds)


def _check_plan_matches(query: Query, graph: PhysicalGraph) -> None:
    """A plan names aliases and tables: they must be this query's."""
    aliases = query.aliases
    for node in graph.nodes:
        if isinstance(node, ph.Scan) and aliases.get(node.alias) != node.table:
            raise PlanEditError(f"the plan scans {node.table} AS {node.alias}, which this query does not read "
                                f"(its tables: {', '.join(f'{t} AS {a}' for a, t in sorted(aliases.items()))})")


def run_query(query: Query, plan: PhysicalCandidate | PhysicalGraph | None) -> QueryResult:
    session = query.session
    candidate = query.plan()
    if isinstance(plan, PhysicalCandidate):
        candidate = plan
    elif isinstance(plan, PhysicalGraph):
        plan.validate()
        candidate = replace(candidate, graph=plan)
    _check_plan_matches(query, candidate.graph)
    tokens = token_columns(query)
    execution, boot_s, boot_kind = session.execution()
    runner = Runner(candidate.graph, RunInputs(query.views(), tokens, DuckTail(session.database)), execution,
                    session.registry.observers, session.registry.progress_listeners)
    output = runner.run()
    fresh, cached = model_token_totals(candidate.graph, output.node_metrics)
    steps, answers = report_view(candidate.graph, output.answer_tables)
    report = QueryReport(
        backend=session.backend.name, model=session.model.name, device=session.device.name,
        order_rule=query.order, wall_s=output.wall_s + (boot_s or 0.0),
        estimated_seconds=candidate.estimated_seconds, sol_seconds=candidate.sol_seconds, boot_s=boot_s,
        boot_kind=boot_kind, fresh_tokens=fresh, cached_tokens=cached,
        minimum_tokens=minimum_tokens(steps, answers, tokens),
        stages=tuple(stages(steps, answers)), node_metrics=output.node_metrics,
        remarks=candidate.remarks, null_inputs=null_inputs(candidate.graph, output.node_metrics),
    )
    rules = ", ".join(rule.name for rule in session.registry.logical_rules)
    text = explain_text(query.logical_plan, candidate, query.order, rules, measured=output.node_metrics)
    return QueryResult(output.table, output.answer_tables, report, text)

