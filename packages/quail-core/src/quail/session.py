"""Session: one configured engine (model, device, backend) and the tables registered on it."""

from __future__ import annotations

import os
from dataclasses import replace
from types import TracebackType

from quail.arguments import check_device_count, session_config, text_argument
from quail.backends.base import ModelBackend, OrderRule, TokenizerSource
from quail.cache.token_ids import remembered
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelKind, ModelSpec
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
from quail.frontend.chains import pair_chain
from quail.frontend.models import NamedModel, with_models
from quail.frontend.spec import QuerySpec, TableSpec
from quail.frontend.sql import Dialect, ParsedStatement, parse_statement, read_parsed
from quail.frontend.syntax import safe_sql, where_of
from quail.plugins.registry import ExtensionRegistry
from quail.runtime.blocking import BlockedQuery
from quail.runtime.chains import ChainedQuery
from quail.runtime.coordinator import Query
from quail.runtime.facets import ModelFacet, model_facet
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
        self._check_aliases()
        self.device: DeviceSpec = self.registry.device(self.config.device)
        check_device_count(self.config, self.device)
        self.backend: ModelBackend = self.registry.backend(self.config.backend)
        self._check_support()
        self.compute: ComputeProvider = self.registry.compute(self.config.compute)
        self.database = Database(external_access=self.config.external_access)
        self.token_store = TokenStore()
        self._facets: dict[str, ModelFacet] = {}
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

    def _check_aliases(self) -> None:
        """Each alias stands for a catalog model and hides none."""
        for alias, name in self.config.model_aliases:
            if name not in self.registry.models:
                raise ConfigError(f"EngineConfig.model_aliases (--model-alias): {alias!r} stands for {name!r}, which "
                                  f"is not one of Quail's models ({', '.join(sorted(self.registry.models))})")
            if alias in self.registry.models and alias != name:
                raise ConfigError(f"EngineConfig.model_aliases (--model-alias): {alias!r} is a catalog model's own "
                                  "name; an alias may not stand for another model")

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
            order: OrderRule | None = None) -> Query | LookupQuery | BlockedQuery | ChainedQuery:
        """The statement planned as one query block (filters, joins, KV reuse) where it is one; otherwise by the
        general rule, each AI call a lookup over its table (`quail.frontend.lookups`). When neither can run it,
        the planner's CompileError says why."""
        self.check_open()
        self.database.refresh()
        text = text_argument("the query given to sql()", text)
        parsed = self._resolved(parse_statement(text, self.database, dialect))
        blocked = blocked_joins(parsed.statement)
        if blocked:
            for node, b in blocked:
                if b.model is not None:
                    self._named(NamedModel("blocking", b.model, "embedding", where_of(node)))
            return self._blocked(parsed, text, dialect, order)
        return self._planned(parsed, text, dialect, order)

    def _planned(self, parsed: ParsedStatement, text: str, dialect: Dialect,
                 order: OrderRule | None) -> Query | LookupQuery | ChainedQuery:
        """A statement's query: a chain of two AI predicates over the same two tables in two steps
        (`quail.frontend.chains`), each planned here again; one block whole; else by the general rule."""
        chain = pair_chain(parsed.statement)
        if chain is not None:
            return ChainedQuery(self, lambda step: self._planned(step, safe_sql(step.statement, dialect), dialect,
                                                                 order), parsed, chain, order)
        try:
            return self._query_of(read_parsed(parsed, text, self.database, dialect), order)
        except GeneralRuleOnly:
            return LookupQuery(self, self._query_of, parsed, dialect, order)
        except GeneralRuleError as refused:
            answered = self._by_lookups(parsed, dialect, order)
            if answered is None:
                raise refused from None
            return answered

    def _resolved(self, parsed: ParsedStatement) -> ParsedStatement:
        """`parsed` with every model its calls name resolved (`frontend.models`): the catalog model's own name, or
        no name where it is the model the session gives that kind of call anyway."""
        resolved: dict[tuple[str, ModelKind], str | None] = {}
        remarks = list(parsed.remarks)
        for named in parsed.models:
            model = self._named(named)
            default = self.model.name if named.kind == "generative" else self.config.embedding_model
            resolved[(named.name, named.kind)] = None if model.name == default else model.name
            if model.name != named.name:
                remarks.append(f"{named.spelling}: model {named.name!r} stands for {model.name} "
                               "(EngineConfig.model_aliases)")
        if not resolved:
            return parsed
        return replace(parsed, statement=with_models(parsed.statement, resolved),
                       remarks=tuple(dict.fromkeys(remarks)))

    def _named(self, named: NamedModel) -> ModelSpec:
        """The catalog model a call names, directly or by an alias; a CompileError at the name otherwise, naming
        the models of the kind the call needs."""
        known = sorted(name for name, spec in self.registry.models.items() if spec.kind == named.kind)
        model = self.registry.models.get(self.config.catalog_name(named.name))
        where = {"line": named.where.line, "column": named.where.column}
        if model is None:
            aliases = ", ".join(f"{a} = {m}" for a, m in self.config.model_aliases) or "none"
            example = self.model.name if named.kind == "generative" else self.config.embedding_model
            raise CompileError(f"{named.spelling} names model {named.name!r}, which is neither one of Quail's "
                               f"{named.kind} models ({', '.join(known) or 'none'}) nor an alias (aliases: {aliases}); "
                               f"name one of them, or make the name an alias: EngineConfig(model_aliases="
                               f"{{{named.name!r}: {example!r}}}) (--model-alias {named.name}={example})", **where)
        if model.kind != named.kind:
            article = "an" if named.kind == "embedding" else "a"
            raise CompileError(f"{named.spelling} names model {named.name!r}, which is not {article} {named.kind} "
                               f"model; the catalog's {named.kind} models: {', '.join(known) or 'none'}", **where)
        return model

    def with_model(self, model: ModelSpec) -> Session | ModelFacet:
        """This session answering with `model`: itself for its own model, else a facet (one per model, so each
        model's tokenizer is loaded once per session)."""
        if model.name == self.model.name:
            return self
        facet = self._facets.get(model.name)
        if facet is None:
            facet = self._facets[model.name] = model_facet(self, model)
        return facet

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
        """A query block planned whole, on the model its calls name."""
        session = self if spec.model is None else self.with_model(self.registry.model(spec.model))
        return Query(session, spec, order)

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

