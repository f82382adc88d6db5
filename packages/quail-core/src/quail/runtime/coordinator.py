"""A query and its run: statistics in, candidates compared, the model part sent to the compute provider, the
relational part run here, the report out.

A `Query` is compiled when it is made; its inputs — each alias's scan view (DuckDB applies the column
predicates), the token ids of the column its prompts read, the documents too long for one pass — are
prepared once per version of the data (`PreparedQuery`) and shared by planning, explain and the run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import pyarrow as pa

from quail.arguments import plan_argument
from quail.backends.base import ModelBackend, ModelRegion, OrderRule, PhysicalCandidate
from quail.cache.planning import stored_answers
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.base import Caller, ComputeProvider, ShardingProvider
from quail.compute.request import PhysicalRequest, PortRef, TableInput, model_token_totals
from quail.config import EngineConfig
from quail.data.database import Database
from quail.data.scan import ScanView
from quail.data.tokenizer import Tokenizer
from quail.data.tokens import TokenColumn, TokenStore
from quail.errors import CompileError, PlanEditError, Refusal, RefusalError
from quail.frontend.compile import compile_query
from quail.frontend.spec import QuerySpec
from quail.logical.nodes import LogicalNode, Scan, validate_plan, walk
from quail.logical.rules import run_rules
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.planner.oversize import OversizedDocuments, find_oversized
from quail.planner.partition import plan_partition, plan_rounds
from quail.planner.statistics import document_columns, planning_context
from quail.plugins.registry import ExtensionRegistry
from quail.progress import ProgressListener
from quail.runtime.duckdb_tail import DuckTail
from quail.runtime.explain import explain_text, render_shards
from quail.runtime.report import QueryReport, minimum_tokens, null_inputs, stages, unparsed
from quail.runtime.results import QueryResult
from quail.runtime.views import scan_views
from quail.serving.runner import RunInputs, Runner

ORDER_RULES: tuple[OrderRule, ...] = ("by_cost", "as_written")


class QuerySession(Protocol):
    """What a query needs of the session that made it (a `quail.Session`)."""

    config: EngineConfig
    registry: ExtensionRegistry
    model: ModelSpec
    device: DeviceSpec
    backend: ModelBackend
    compute: ComputeProvider
    database: Database
    token_store: TokenStore

    @property
    def tokenizer(self) -> Tokenizer: ...

    def check_open(self) -> None: ...

    def with_model(self, model: ModelSpec) -> QuerySession:
        """This session answering with `model` (a model a call names; `runtime.facets`)."""
        ...


@dataclass(frozen=True)
class PreparedQuery:
    """A query's inputs for one version of its tables, made once: planning, explain and the run all read these.

    `tokens` are the documents as the model sees them — too long ones skipped or truncated as
    `EngineConfig.oversized_documents` says; `skipped` holds, per alias, the rows left out.
    """

    generation: int
    views: Mapping[str, ScanView]
    tokens: Mapping[str, TokenColumn]
    skipped: Mapping[str, pa.Array]
    oversized: OversizedDocuments


class Query:
    """A compiled query: its logical plan is built (and checked) when the query is created."""

    def __init__(self, session: QuerySession, spec: QuerySpec, order: OrderRule | None = None) -> None:
        if order is not None and order not in ORDER_RULES:
            raise CompileError(f"order must be one of {', '.join(ORDER_RULES)}, got {order!r}")
        self.session = session
        self.spec = spec
        self.order: OrderRule = order or "by_cost"
        unoptimized = compile_query(spec, session.database.catalog)
        self.logical_plan: LogicalNode = run_rules(unoptimized, session.registry.logical_rules)
        validate_plan(self.logical_plan)
        self._views: tuple[int, dict[str, ScanView]] | None = None
        self._prepared: PreparedQuery | None = None
        self._candidate: tuple[int, PhysicalCandidate] | None = None

    @property
    def aliases(self) -> dict[str, str]:
        """alias → table of every Scan in the plan."""
        return {node.alias: node.table for node in walk(self.logical_plan) if isinstance(node, Scan)}

    def views(self) -> dict[str, ScanView]:
        """Each alias's scan view: its column predicates applied by DuckDB, only the columns it needs."""
        database = self.session.database
        database.refresh()
        if self._views is None or self._views[0] != database.generation:
            views = scan_views(self.logical_plan, database)
            self._views = (database.generation, views)
        return self._views[1]

    def prepared(self) -> PreparedQuery:
        """The views, token ids and oversized documents of the tables as they are now (made once per version)."""
        views = self.views()
        generation = self.session.database.generation
        if self._prepared is None or self._prepared.generation != generation:
            self._prepared = _prepare(self.session, self.logical_plan, views, generation)
        return self._prepared

    def plan(self) -> PhysicalCandidate:
        """The cheapest physical plan the backend offers (planned once, again if a table changed; no model run)."""
        prepared = self.prepared()
        if self._candidate is None or self._candidate[0] != prepared.generation:
            self._candidate = (prepared.generation, _cheapest_plan(self, prepared))
        return self._candidate[1]

    def explain(self, verbose: bool = False, analyze: bool = False) -> str:
        """Logical and physical plans with estimates and decisions; `analyze` runs and adds measurements."""
        if analyze:
            return self.run().explain()
        rules = ", ".join(rule.name for rule in self.session.registry.logical_rules)
        try:
            candidate, refusal = self.plan(), None
        except (RefusalError, CompileError) as error:
            candidate, refusal = None, str(error)
        shown = candidate.plan if candidate is not None else self.logical_plan
        sharding = planned_shards(self.session, candidate.graph, self.prepared()) if candidate is not None else []
        return explain_text(shown, candidate, self.order, rules, self.session.model.name, refusal,
                            sharding=sharding)

    def run(self, plan: PhysicalCandidate | PhysicalGraph | None = None) -> QueryResult:
        """Execute; `plan` may be an edited physical graph of this query."""
        self.session.check_open()
        plan_argument(plan)
        candidate = self.plan()
        if isinstance(plan, PhysicalCandidate):
            candidate = plan
        elif isinstance(plan, PhysicalGraph):
            plan.validate()
            candidate = replace(candidate, graph=plan)
        _check_plan_matches(self.aliases, candidate.graph)
        return run_candidate(self.session, self.order, candidate, self.prepared())

    def collect(self) -> pa.Table:
        return self.run().collect()


def _prepare(session: QuerySession, plan: LogicalNode, views: Mapping[str, ScanView],
             generation: int) -> PreparedQuery:
    tokens = {alias: session.token_store.tokens(views[alias], column, session.tokenizer)
              for alias, column in document_columns(plan).items()}
    oversized = find_oversized(session.config.oversized_documents, plan, tokens, session.tokenizer,
                               session.model, session.config.chunk_tokens)
    kept, skipped = oversized.apply(tokens)
    return PreparedQuery(generation, views, kept, skipped, oversized)


def _cheapest_plan(query: Query, prepared: PreparedQuery) -> PhysicalCandidate:
    session = query.session
    with stored_answers(session.backend, session.model, session.device, session.config, prepared.tokens,
                        session.tokenizer) as stored:
        context = planning_context(query.logical_plan, prepared.views, prepared.tokens, session.tokenizer,
                                   session.config, session.model, session.device, query.order, prepared.skipped,
                                   stored)
        offered = session.backend.plan(ModelRegion(query.logical_plan), context)
    if isinstance(offered, Refusal):
        raise RefusalError(offered)
    if not offered:
        raise RefusalError(Refusal(f"backend {session.backend.name!r} offered no plan"))
    cheapest = min(offered, key=lambda c: c.estimated_seconds)
    return replace(cheapest, remarks=(*cheapest.remarks, *prepared.oversized.remarks(),
                                      *blocking_proposals(cheapest.graph, prepared)))


BLOCKING_PROPOSED_PAIRS = 10_000
"""An AI join asking at least this many pairs of two tables gets a remark proposing similarity blocking."""
PROPOSED_K = 20


def blocking_proposals(graph: PhysicalGraph, prepared: PreparedQuery) -> list[str]:
    """For each AI join of two tables that asks every pair and asks many: what similarity blocking would ask instead
    (`quail.frontend.blocking`; it changes which pairs are asked, so it is the user's choice, never made silently)."""
    remarks = []
    for node in graph.nodes:
        if (not isinstance(node, ph.AiJoin) or node.semantics != "full" or len(node.partners) != 1
                or "candidates" in graph.inputs_of(node.id)):
            continue
        anchors, partners = (len(prepared.tokens[ref.alias]) for ref in (node.anchor, node.partners[0]))
        if anchors * partners < BLOCKING_PROPOSED_PAIRS:
            continue
        first, second = (anchors, partners) if node.predicate.prompt.columns[0].alias == node.anchor.alias else (
            partners, anchors)
        kept = first * min(PROPOSED_K, second)
        remarks.append(f"AI join #{node.predicate.position} asks {anchors * partners:,} pairs: similarity blocking "
                       f"would ask about {kept:,} — give it the options blocking 'top_k' and k {PROPOSED_K} (each "
                       "{0} text keeps its nearest {1} texts by embedding; the run estimates the recall)")
    return remarks


def _check_plan_matches(aliases: Mapping[str, str], graph: PhysicalGraph) -> None:
    """A plan names aliases and tables: they must be this query's."""
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
    """alias → the columns hash joins compare or their pair conditions read: the only table columns the far side
    reads."""
    keys: dict[str, list[str]] = {}
    for node in graph.nodes:
        if not isinstance(node, ph.HashJoin):
            continue
        read = [ref for e in node.equalities for ref in (e.left, e.right)]
        read += [ref for condition in node.conditions for ref in condition.columns]
        for ref in read:
            columns = keys.setdefault(ref.alias, [])
            if ref.column not in columns:
                columns.append(ref.column)
    return keys


def model_request(session: QuerySession, graph: PhysicalGraph, prepared: PreparedQuery) -> PhysicalRequest:
    keys = key_columns(graph)
    tables = {alias: TableInput(alias, view.num_rows, prepared.tokens.get(alias),
                                view.to_table(keys[alias]) if alias in keys else pa.table({}),
                                prepared.skipped.get(alias))
              for alias, view in prepared.views.items()}
    return PhysicalRequest(session.backend.name, graph, model_outputs(graph), tables, session.config, session.model,
                           session.device)


def planned_shards(session: QuerySession, graph: PhysicalGraph, prepared: PreparedQuery) -> list[str]:
    """What explain says of the split over workers, for a provider that splits (nothing otherwise)."""
    compute, config = session.compute, session.config
    if not isinstance(compute, ShardingProvider):
        return planned_rounds(config, graph, prepared)
    workers = compute.planned_workers(config)
    if workers is None:
        return [f"compute {config.compute!r}: the workers are counted when the cluster is reached; set "
                "EngineConfig.workers to see the shards before a run"]
    partition = plan_partition(graph, prepared.tokens, workers, page_tokens=config.kv_page_tokens)
    return [f"compute {config.compute!r}: " + line if i == 0 else line for i, line in enumerate(partition.describe())]


def planned_rounds(config: EngineConfig, graph: PhysicalGraph, prepared: PreparedQuery) -> list[str]:
    """What explain says of a LIMIT met early on one worker (`quail.compute.rounds`): nothing when there is none."""
    partition = plan_rounds(graph, prepared.tokens) if config.early_limit != "off" else None
    if partition is None or partition.rounds == 0 or len(partition.phases[-1].shards) < 2:
        return []
    last = partition.phases[-1]
    sizes = ", ".join(f"{shard.documents:,}" for shard in last.shards[:4]) + (", …" if len(last.shards) > 4 else "")
    return [f"LIMIT {partition.limit} met early: the model reads the {sum(s.documents for s in last.shards):,} "
            f"documents of {last.alias} in rounds of {sizes} and stops once the LIMIT has its rows "
            "(EngineConfig.early_limit='off' reads them all)"]


def _fan_out(listeners: tuple[ProgressListener, ...]) -> ProgressListener | None:
    if not listeners:
        return None

    def progress(node: ph.PhysicalNode, done: int, total: int) -> None:
        for listener in listeners:
            listener(node, done, total)

    return progress


def run_candidate(session: QuerySession, order: OrderRule, candidate: PhysicalCandidate,
         prepared: PreparedQuery) -> QueryResult:
    """The model part on the compute provider, the relational part here over its answers, the report."""
    graph, tokens, registry = candidate.graph, prepared.tokens, session.registry
    started = time.perf_counter()
    response = session.compute.execute(model_request(session, graph, prepared),
                                       Caller(registry, _fan_out(registry.progress_listeners)))
    for node_id, metrics in response.metrics.nodes.items():
        for observer in registry.observers:
            observer(graph.node(node_id), metrics)
    tail = DuckTail(session.database, session.tokenizer)
    runner = Runner(graph, RunInputs(prepared.views, tokens, prepared.skipped, tail),
                    backend=session.backend.name, observers=registry.observers)
    output = runner.run([(graph.root, "table")], known=response.tables)
    wall_s = time.perf_counter() - started
    node_metrics = {**response.metrics.nodes, **output.node_metrics}
    answers = {node.id: response.tables[(node.id, port)] for node in graph.nodes if node.is_model_node
               for port in node.OUTPUTS}
    fresh, cached = model_token_totals(graph, node_metrics)
    report = QueryReport(
        backend=session.backend.name, model=session.model.name, device=session.device.name,
        order_rule=order, wall_s=wall_s, estimated_seconds=candidate.estimated_seconds,
        sol_seconds=candidate.sol_seconds, boot_s=response.metrics.boot_s, boot_kind=response.metrics.boot_kind,
        fresh_tokens=fresh, cached_tokens=cached, minimum_tokens=minimum_tokens(graph, answers, tokens),
        stages=tuple(stages(graph, answers)), node_metrics=node_metrics, remarks=candidate.remarks,
        engine=response.metrics.notes, oversized_documents=prepared.oversized.report(), shards=response.metrics.shards,
        null_inputs=null_inputs(graph, node_metrics), unparsed=unparsed(graph, answers, session.tokenizer.decode),
    )
    rules = ", ".join(rule.name for rule in registry.logical_rules)
    text = explain_text(candidate.plan, candidate, order, rules, session.model.name, measured=node_metrics,
                        engine=response.metrics.notes, sharding=render_shards(response.metrics.shards))
    return QueryResult(output.tables[(graph.root, "table")], answers, report, text)
