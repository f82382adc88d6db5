"""Session: one configured engine (model, device, backend) and the tables registered on it."""

from __future__ import annotations

import os
from types import TracebackType

import pyarrow as pa

from quail.arguments import check_device_count, plan_argument, session_config, text_argument
from quail.backends.base import ModelBackend, OrderRule, PhysicalCandidate, TokenizerSource
from quail.cache.token_ids import remembered
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.base import ComputeProvider
from quail.config import EngineConfig
from quail.data.database import Database
from quail.data.providers import TableSchema
from quail.data.scan import ScanView
from quail.data.sources import as_source
from quail.data.tokenizer import Tokenizer
from quail.data.tokens import TokenStore
from quail.errors import CompileError, GeneralRuleError, QuailError, Refusal, RefusalError
from quail.frontend.builder import Docs
from quail.frontend.compile import compile_query
from quail.frontend.spec import QuerySpec, TableSpec
from quail.frontend.sql import Dialect, parse_sql, parse_statement
from quail.logical.nodes import LogicalNode, Scan, validate_plan, walk
from quail.logical.rules import run_rules
from quail.physical.graph import PhysicalGraph
from quail.plugins.registry import ExtensionRegistry
from quail.runtime.execution import plan_physical, planned_shards, run_query
from quail.runtime.explain import explain_text
from quail.runtime.lookups import LookupQuery
from quail.runtime.results import QueryResult
from quail.runtime.views import scan_views

ORDER_RULES: tuple[OrderRule, ...] = ("by_cost", "as_written")


class Session:
    """Validates the configuration at once: a session that exists can run its backend.

    A session holds tables and token files; the engines its queries boot belong to the compute
    provider (`EngineConfig.compute`) and outlive it — the next session on the same model finds its
    engine warm. `quail.release_engines()` closes them.
    """

    def __init__(self, config: EngineConfig | None = None, *, registry: ExtensionRegistry | None = None,
                 tokenizer: Tokenizer | None = None) -> None:
        self.config = session_config(config)
        self._tokenizer = tokenizer
        self.registry = registry if registry is not None else ExtensionRegistry.with_built_ins()
        self.model: ModelSpec = self.registry.model(self.config.model)
        self.device: DeviceSpec = self.registry.device(self.config.device)
        check_device_count(self.config, self.device)
        self.backend: ModelBackend = self.registry.backend(self.config.backend)
        self._check_support()
        self.compute: ComputeProvider = self.registry.compute(self.config.compute)
        self.database = Database(external_access=self.config.external_access)
        self.token_store = TokenStore()
        self._closed = False

    def _check_support(self) -> None:
        verdict = self.backend.supports(self.model, self.device, self.config.gpus)
        if not verdict.accepted:
            raise RefusalError(Refusal(
                f"backend {self.backend.name!r} does not support model {self.model.name!r} "
                f"on device {self.device.name!r} with {self.config.gpus} device(s)",
                (verdict.reason or "no reason given",),
            ))

    # -- tables -------------------------------------------------------------------------------

    def register(self, name: str, data: object, *, id_column: str | None = None, table: str | None = None) -> None:
        """Make a table available to queries under `name`.

        `data` is a DocumentProvider, a pyarrow Table / RecordBatch / RecordBatchReader / Dataset, a
        pandas or polars DataFrame, a DuckDB relation, or the path of a Parquet, CSV, JSON, Arrow or
        DuckDB file (`table` names the table of a DuckDB database). `id_column`, when given, must be
        non-null and unique. Files are read again when they change on disk.
        """
        self.check_open()
        if not text_argument("the table name given to register()", name).isidentifier():
            raise CompileError(f"table name {name!r} is not an identifier")
        if name.startswith("__quail"):
            raise CompileError(f"table name {name!r} is reserved for Quail's own relations")
        if isinstance(data, str | os.PathLike) and table is None and not os.path.exists(data) and ":" in str(data):
            path, _, table = str(data).rpartition(":")
            data = path
        self.database.register(name, as_source(data, id_column, table))

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer queries are planned with: the one given, else the backend's for this model, its ids
        remembered in the answer store when there is one (`quail.cache.token_ids`)."""
        if self._tokenizer is None:
            if not isinstance(self.backend, TokenizerSource):
                raise RefusalError(Refusal(
                    f"no tokenizer for model {self.model.name!r}",
                    (f"backend {self.backend.name!r} offers none; pass Session(..., tokenizer=...)",),
                ))
            self._tokenizer = remembered(self.backend.tokenizer(self.model), self.backend, self.config)
        return self._tokenizer

    @property
    def catalog(self) -> dict[str, TableSchema]:
        return self.database.catalog

    # -- queries ------------------------------------------------------------------------------

    def sql(self, text: str, dialect: Dialect = "snowflake", order: OrderRule | None = None) -> Query | LookupQuery:
        """The statement planned as one query block (filters, joins, KV reuse) where it is one; otherwise by the
        general rule, each AI call a lookup over its table (`quail.frontend.lookups`). When neither can run it,
        the planner's CompileError says why."""
        self.check_open()
        self.database.refresh()
        text = text_argument("the query given to sql()", text)
        try:
            return Query(self, parse_sql(text, self.database, dialect), order)
        except GeneralRuleError as refused:
            answered = self._by_lookups(text, dialect, order)
            if answered is None:
                raise refused from None
            return answered

    def _by_lookups(self, text: str, dialect: Dialect, order: OrderRule | None) -> LookupQuery | None:
        try:
            return LookupQuery(self, self._query_of, parse_statement(text, self.database, dialect), dialect, order)
        except CompileError:
            return None

    def docs(self, table: str) -> Docs:
        """Start a builder query over a registered table (its alias defaults to its name)."""
        self.check_open()
        start = Docs(lambda: self.catalog, self._query_of)
        return start._checked(QuerySpec(tables=(TableSpec(table, table),), select=()), 0)

    def _query_of(self, spec: QuerySpec, order: OrderRule | None) -> Query:
        return Query(self, spec, order)

    # -- lifetime -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """A closed session has removed its token files: say so rather than fail somewhere inside."""
        if self._closed:
            raise QuailError("this session is closed: open a new quail.Session (engines it booted are still warm)")

    def close(self) -> None:
        """Remove the session's token files; safe to call twice. Engines stay with the compute provider."""
        if self._closed:
            return
        self._closed = True
        try:
            self.token_store.close()
        finally:
            self.database.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class Query:
    """A compiled query: its logical plan is built (and checked) when the query is created."""

    def __init__(self, session: Session, spec: QuerySpec, order: OrderRule | None = None) -> None:
        if order is not None and order not in ORDER_RULES:
            raise CompileError(f"order must be one of {', '.join(ORDER_RULES)}, got {order!r}")
        self.session = session
        self.spec = spec
        self.order: OrderRule = order or "by_cost"
        unoptimized = compile_query(spec, session.catalog)
        self.logical_plan: LogicalNode = run_rules(unoptimized, session.registry.logical_rules)
        validate_plan(self.logical_plan)
        self._candidate: PhysicalCandidate | None = None
        self._planned_on = -1

    def views(self) -> dict[str, ScanView]:
        """Each alias's scan view: its column predicates applied by DuckDB, only the columns it needs."""
        return scan_views(self.logical_plan, self.session.database)

    @property
    def aliases(self) -> dict[str, str]:
        """alias → table of every Scan in the plan."""
        return {node.alias: node.table for node in walk(self.logical_plan) if isinstance(node, Scan)}

    def plan(self) -> PhysicalCandidate:
        """The cheapest physical plan the backend offers (planned once, again if a table changed; no model run)."""
        self.session.database.refresh()
        if self._candidate is None or self._planned_on != self.session.database.generation:
            self._candidate = plan_physical(self)
            self._planned_on = self.session.database.generation
        return self._candidate

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
        sharding = planned_shards(self, candidate.graph) if candidate is not None else []
        return explain_text(shown, candidate, self.order, rules, refusal, sharding=sharding)

    def run(self, plan: PhysicalCandidate | PhysicalGraph | None = None) -> QueryResult:
        self.session.check_open()
        """Execute; `plan` may be an edited physical graph of this query."""
        plan_argument(plan)
        return run_query(self, plan)

    def collect(self) -> pa.Table:
        return self.run().collect()
