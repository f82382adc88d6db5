"""Session: one configured engine (model, device, backend) and the tables registered on it."""

from __future__ import annotations

import os
from types import TracebackType

from quail.arguments import check_device_count, session_config, text_argument
from quail.backends.base import ModelBackend, OrderRule, TokenizerSource
from quail.cache.token_ids import remembered
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.base import ComputeProvider
from quail.config import EngineConfig
from quail.data.database import Database
from quail.data.providers import TableSchema
from quail.data.sources import as_source
from quail.data.tokenizer import Tokenizer
from quail.data.tokens import TokenStore
from quail.errors import CompileError, ConfigError, GeneralRuleError, GeneralRuleOnly, QuailError, Refusal, RefusalError
from quail.frontend.blocking import blocked_joins
from quail.frontend.builder import Docs
from quail.frontend.embedding_forms import EmbeddingModel
from quail.frontend.forms import NamedModel
from quail.frontend.spec import QuerySpec, TableSpec
from quail.frontend.sql import Dialect, ParsedStatement, parse_statement, read_parsed
from quail.frontend.syntax import where_of
from quail.plugins.registry import ExtensionRegistry
from quail.runtime.blocking import BlockedQuery
from quail.runtime.coordinator import Query
from quail.runtime.lookups import LookupQuery


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
        self._check_model_kinds()
        self.device: DeviceSpec = self.registry.device(self.config.device)
        check_device_count(self.config, self.device)
        self.backend: ModelBackend = self.registry.backend(self.config.backend)
        self._check_support()
        self.compute: ComputeProvider = self.registry.compute(self.config.compute)
        self.database = Database(external_access=self.config.external_access)
        self.token_store = TokenStore()
        self._closed = False

    def _check_model_kinds(self) -> None:
        """The session's model answers and writes; its embedding model embeds: each must be of its kind."""
        if self.model.kind != "generative":
            raise ConfigError(f"EngineConfig.model (--model) {self.model.name!r} is an embedding model: name a "
                              "generative model there, and embedding models in EngineConfig.embedding_model "
                              "(--embedding-model)")
        embedding = self.registry.model(self.config.embedding_model)
        if embedding.kind != "embedding":
            raise ConfigError(f"EngineConfig.embedding_model (--embedding-model) {embedding.name!r} is not an "
                              f"embedding model; the catalog's embedding models: "
                              f"{', '.join(self.embedding_models) or 'none'}")

    @property
    def embedding_models(self) -> list[str]:
        """The catalog's embedding models (AI.EMBED / AI.SIMILARITY), by name."""
        return sorted(name for name, spec in self.registry.models.items() if spec.kind == "embedding")

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

    def sql(self, text: str, dialect: Dialect = "snowflake",
            order: OrderRule | None = None) -> Query | LookupQuery | BlockedQuery:
        """The statement planned as one query block (filters, joins, KV reuse) where it is one; otherwise by the
        general rule, each AI call a lookup over its table (`quail.frontend.lookups`). When neither can run it,
        the planner's CompileError says why."""
        self.check_open()
        self.database.refresh()
        text = text_argument("the query given to sql()", text)
        parsed = parse_statement(text, self.database, dialect)
        self._check_named_models(parsed.models)
        self._check_embedding_models(parsed.embedding_models)
        blocked = blocked_joins(parsed.statement)
        if blocked:
            self._check_embedding_models(tuple(EmbeddingModel("blocking", b.model, where_of(node))
                                               for node, b in blocked if b.model is not None))
            return self._blocked(parsed, text, dialect, order)
        try:
            return Query(self, read_parsed(parsed, text, self.database, dialect), order)
        except GeneralRuleOnly:
            return LookupQuery(self, self._query_of, parsed, dialect, order)
        except GeneralRuleError as refused:
            answered = self._by_lookups(parsed, dialect, order)
            if answered is None:
                raise refused from None
            return answered

    def _check_named_models(self, models: tuple[NamedModel, ...]) -> None:
        """A generation call that names one of Quail's catalog models other than the session's is refused: it would
        be answered by the session's model (a model per call is not supported yet). A name the catalog does not
        know (a warehouse's model, `llama3.1-8b`) is answered by the session's model, and explain() says so."""
        known = self.registry.models
        for model in models:
            if model.name in known and model.name != self.model.name:
                raise CompileError(f"{model.spelling} names model {model.name!r}, a catalog model other than this "
                                   f"session's ({self.model.name!r}); a model per call is not supported yet: run the "
                                   f"query in a session with EngineConfig(model={model.name!r}) (--model "
                                   f"{model.name})", line=model.where.line, column=model.where.column)

    def _check_embedding_models(self, models: tuple[EmbeddingModel, ...]) -> None:
        """An embedding call may name any of the catalog's embedding models (it answers with that one); naming one of
        its generative models is a mistake said at once. A name the catalog does not know (a warehouse's model) is
        answered by EngineConfig.embedding_model, and explain() says so."""
        known = self.registry.models
        for model in models:
            if model.name in known and known[model.name].kind != "embedding":
                raise CompileError(f"{model.spelling} names model {model.name!r}, which is not an embedding model; the "
                                   f"catalog's embedding models: {', '.join(self.embedding_models) or 'none'}",
                                   line=model.where.line, column=model.where.column)

    def _blocked(self, parsed: ParsedStatement, text: str, dialect: Dialect, order: OrderRule | None) -> BlockedQuery:
        """A statement whose AI join asks only the pairs its embeddings keep (`quail.frontend.blocking`)."""
        try:
            return BlockedQuery(self, self._query_of, parsed, text, dialect, order)
        except GeneralRuleError as error:
            raise CompileError(f"similarity blocking applies to an AI join the planner of one query block plans: "
                               f"{error.detail}", line=error.line, column=error.column) from None

    def _by_lookups(self, parsed: ParsedStatement, dialect: Dialect, order: OrderRule | None) -> LookupQuery | None:
        try:
            return LookupQuery(self, self._query_of, parsed, dialect, order)
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

