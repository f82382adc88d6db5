"""Running a Query from its session: statistics in, candidates compared, the model part sent to the
compute provider, the relational part run here, the report out."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa

from quail.backends.base import ModelRegion, PhysicalCandidate, PhysicalRequest, PortRef, TableInput
from quail.cache.planning import stored_answers
from quail.compute.base import Caller, ShardingProvider
from quail.data.scan import ScanView
from quail.data.tokens import TokenColumn
from quail.errors import PlanEditError, Refusal, RefusalError
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.planner.oversize import OversizedDocuments, find_oversized
from quail.planner.partition import plan_partition
from quail.planner.statistics import document_columns, planning_context
from quail.runtime.duckdb_tail import DuckTail
from quail.runtime.explain import explain_text, render_shards
from quail.runtime.progress import ProgressListener
from quail.runtime.report import QueryReport, minimum_tokens, model_token_totals, null_inputs, stages
from quail.runtime.results import QueryResult
from quail.runtime.runner import RunInputs, Runner

if TYPE_CHECKING:
    from quail.session import Query, Session


def providers_of(query: Query) -> dict[str, ScanView]:
    """alias → the scan view it reads: its table after the query's column predicates, computed by DuckDB."""
    return query.views()


def token_columns(query: Query) -> dict[str, TokenColumn]:
    """alias → the token ids of the column its prompts read (tokenized once per content and tokenizer)."""
    session = query.session
    providers = providers_of(query)
    return {alias: session.token_store.tokens(providers[alias], column, session.tokenizer)
            for alias, column in document_columns(query.logical_plan).items()}


def prepared_documents(query: Query) -> tuple[OversizedDocuments, dict[str, TokenColumn], dict[str, pa.Array]]:
    """(oversized documents, token columns, rows left out per alias): what planning and running see, with
    documents too long for one pass skipped or truncated as `EngineConfig.oversized_documents` says."""
    session = query.session
    tokens = token_columns(query)
    oversized = find_oversized(session.config.oversized_documents, query.logical_plan, tokens, session.tokenizer,
                               session.model, session.config.chunk_tokens)
    kept, skipped = oversized.apply(tokens)
    return oversized, kept, skipped


def plan_physical(query: Query) -> PhysicalCandidate:
    session = query.session
    oversized, tokens, skipped = prepared_documents(query)
    with stored_answers(session.backend, session.model, session.device, session.config, tokens,
                        session.tokenizer) as stored:
        context = planning_context(query.logical_plan, providers_of(query), tokens, session.tokenizer,
                                   session.config, session.model, session.device, query.order, skipped, stored)
        offered = session.backend.plan(ModelRegion(query.logical_plan), context)
    if isinstance(offered, Refusal):
        raise RefusalError(offered)
    if not offered:
        raise RefusalError(Refusal(f"backend {session.backend.name!r} offered no plan"))
    cheapest = min(offered, key=lambda c: c.estimated_seconds)
    return replace(cheapest, remarks=(*cheapest.remarks, *oversized.remarks()))


def _check_plan_matches(query: Query, graph: PhysicalGraph) -> None:
    """A plan names aliases and tables: they must be this query's."""
    aliases = query.aliases
    for node in graph.nodes:
        if isinstance(node, ph.Scan) and aliases.get(node.alias) != node.table:
            raise PlanEditError(f"the plan scans {node.table} AS {node.alias}, which this query does not read "
                                f"(its tables: {', '.join(f'{t} AS {a}' for a, t in sorted(aliases.items()))})")


def model_outputs(graph: PhysicalGraph) -> tuple[PortRef, ...]:
    """What the far side returns: every model node's answers and the rows the root (run here) reads."""
    answers = [(node.id, port) for node in graph.nodes if node.is_model_node for port in node.OUTPUTS]
    feeding_root = [(edge.source, edge.source_port) for edge in graph.inputs_of(graph.root).values()]
    return tuple(dict.fromkeys([*answers, *feeding_root]))


def key_columns(graph: PhysicalGraph) -> dict[str, list[str]]:
    """alias → the columns hash joins compare: the only table columns the far side reads."""
    keys: dict[str, list[str]] = {}
    for node in graph.nodes:
        for equality in node.equalities if isinstance(node, ph.HashJoin) else ():
            for ref in (equality.left, equality.right):
                columns = keys.setdefault(ref.alias, [])
                if ref.column not in columns:
                    columns.append(ref.column)
    return keys


def model_request(session: Session, graph: PhysicalGraph, providers: Mapping[str, ScanView],
                  tokens: Mapping[str, TokenColumn], skipped: Mapping[str, pa.Array]) -> PhysicalRequest:
    keys = key_columns(graph)
    tables = {alias: TableInput(alias, provider.num_rows, tokens.get(alias),
                                provider.to_table(keys[alias]) if alias in keys else pa.table({}), skipped.get(alias))
              for alias, provider in providers.items()}
    return PhysicalRequest(session.backend.name, graph, model_outputs(graph), tables, session.config, session.model,
                           session.device)


def planned_shards(query: Query, graph: PhysicalGraph) -> list[str]:
    """What explain says of the split over workers, for a provider that splits (nothing otherwise)."""
    compute, config = query.session.compute, query.session.config
    if not isinstance(compute, ShardingProvider):
        return []
    workers = compute.planned_workers(config)
    if workers is None:
        return [f"compute {config.compute!r}: the workers are counted when the cluster is reached; set "
                "EngineConfig.workers to see the shards before a run"]
    partition = plan_partition(graph, token_columns(query), workers, page_tokens=config.kv_page_tokens)
    return [f"compute {config.compute!r}: " + line if i == 0 else line for i, line in enumerate(partition.describe())]


def _fan_out(listeners: tuple[ProgressListener, ...]) -> ProgressListener | None:
    if not listeners:
        return None

    def progress(node: ph.PhysicalNode, done: int, total: int) -> None:
        for listener in listeners:
            listener(node, done, total)

    return progress


def run_query(query: Query, plan: PhysicalCandidate | PhysicalGraph | None) -> QueryResult:
    session = query.session
    candidate = query.plan()
    if isinstance(plan, PhysicalCandidate):
        candidate = plan
    elif isinstance(plan, PhysicalGraph):
        plan.validate()
        candidate = replace(candidate, graph=plan)
    graph = candidate.graph
    _check_plan_matches(query, graph)
    oversized, tokens, skipped = prepared_documents(query)
    providers = providers_of(query)
    registry = session.registry
    started = time.perf_counter()
    response = session.compute.execute(model_request(session, graph, providers, tokens, skipped),
                                       Caller(registry, _fan_out(registry.progress_listeners)))
    for node_id, metrics in response.metrics.nodes.items():
        for observer in registry.observers:
            observer(graph.node(node_id), metrics)
    runner = Runner(graph, RunInputs(providers, tokens, skipped, DuckTail(session.database)),
                    backend=session.backend.name, observers=registry.observers)
    output = runner.run([(graph.root, "table")], known=response.tables)
    wall_s = time.perf_counter() - started
    node_metrics = {**response.metrics.nodes, **output.node_metrics}
    answers = {node.id: response.tables[(node.id, port)] for node in graph.nodes if node.is_model_node
               for port in node.OUTPUTS}
    fresh, cached = model_token_totals(graph, node_metrics)
    report = QueryReport(
        backend=session.backend.name, model=session.model.name, device=session.device.name,
        order_rule=query.order, wall_s=wall_s, estimated_seconds=candidate.estimated_seconds,
        sol_seconds=candidate.sol_seconds, boot_s=response.metrics.boot_s, boot_kind=response.metrics.boot_kind,
        fresh_tokens=fresh, cached_tokens=cached, minimum_tokens=minimum_tokens(graph, answers, tokens),
        stages=tuple(stages(graph, answers)), node_metrics=node_metrics, remarks=candidate.remarks,
        engine=response.metrics.notes, oversized_documents=oversized.report(), shards=response.metrics.shards,
        null_inputs=null_inputs(graph, node_metrics),
    )
    rules = ", ".join(rule.name for rule in registry.logical_rules)
    text = explain_text(candidate.plan, candidate, query.order, rules, measured=node_metrics,
                        engine=response.metrics.notes, sharding=render_shards(response.metrics.shards))
    return QueryResult(output.tables[(graph.root, "table")], answers, report, text)
