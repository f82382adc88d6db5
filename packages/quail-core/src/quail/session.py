"""Session: one configured engine (model, device, backend) and the tables registered on it."""

from __future__ import annotations

from types import TracebackType

from quail.backends.base import ModelBackend, OrderRule
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig
from quail.data.providers import DocumentProvider, TableSchema
from quail.errors import CompileError, Refusal, RefusalError
from quail.frontend.builder import Docs
from quail.frontend.compile import compile_query
from quail.frontend.spec import QuerySpec, TableSpec
from quail.frontend.sql import Dialect, parse_sql
from quail.logical.nodes import LogicalNode, render
from quail.logical.rules import run_rules
from quail.plugins.registry import ExtensionRegistry

ORDER_RULES: tuple[OrderRule, ...] = ("by_cost", "as_written")


class Session:
    """Validates the configuration at once: a session that exists can run its backend."""

    def __init__(self, config: EngineConfig | None = None, *,
                 registry: ExtensionRegistry | None = None) -> None:
        self.config = config or EngineConfig()
        self.registry = registry if registry is not None else ExtensionRegistry.with_built_ins()
        self.model: ModelSpec = self.registry.model(self.config.model)
        self.device: DeviceSpec = self.registry.device(self.config.device)
        self.backend: ModelBackend = self.registry.backend(self.config.backend)
        self._check_support()
        self.runtime_state: dict[str, object] = {}
        self._tables: dict[str, DocumentProvider] = {}
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

    def register(self, name: str, provider: DocumentProvider) -> None:
        """Make a document table available to queries under `name`."""
        if not name.isidentifier():
            raise CompileError(f"table name {name!r} is not an identifier")
        if not isinstance(provider, DocumentProvider):
            raise TypeError(f"register() takes a DocumentProvider, got {type(provider).__name__}")
        self._tables[name] = provider

    @property
    def catalog(self) -> dict[str, TableSchema]:
        return {name: provider.schema(name) for name, provider in self._tables.items()}

    # -- queries ------------------------------------------------------------------------------

    def sql(self, text: str, dialect: Dialect = "snowflake", order: OrderRule | None = None) -> Query:
        return Query(self, parse_sql(text, dialect), order)

    def docs(self, table: str) -> Docs:
        """Start a builder query over a registered table (its alias defaults to its name)."""
        start = Docs(self.catalog, self._query_of)
        return start._checked(QuerySpec(tables=(TableSpec(table, table),), select=()), 0)

    def _query_of(self, spec: QuerySpec, order: OrderRule | None) -> Query:
        return Query(self, spec, order)

    # -- lifetime -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release what the session holds; safe to call twice."""
        self._closed = True

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

    def explain(self) -> str:
        """The logical plan, with no model loaded."""
        rules = ", ".join(rule.name for rule in self.session.registry.logical_rules)
        return "\n".join([
            f"== Logical plan (order rule: {self.order}; rules applied: {rules}) ==",
            render(self.logical_plan),
        ])
