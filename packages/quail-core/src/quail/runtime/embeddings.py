"""An embedding lookup's query: the distinct texts of an AI.EMBED call, embedded by the embedding model.

The general rule (`quail.frontend.lookups`) makes every AI.EMBED / AI_EMBED call — and so every AI.SIMILARITY, two
of them — a lookup over the distinct texts it reads. This is that lookup's query: the texts are tokenized with the
embedding model's tokenizer and sent, as one `AiEmbed` node, through the same compute provider, answer store and
engine cache as every model node, with the embedding model as the request's model; the vectors come back through
the same runner and relational tail. There is nothing to choose between plans (each text is read once, whole), so
the plan is written here rather than asked of the backend; explain() shows it with its estimate.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from quail.backends.base import PhysicalCandidate
from quail.backends.default import Backend
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig
from quail.errors import RefusalError
from quail.frontend.calls import call_value
from quail.frontend.lookups import LOOKUP_ALIAS, VALUE, Lookup
from quail.frontend.models import model_option
from quail.frontend.relational import OUTPUTS_RELATION, rows_relation
from quail.frontend.syntax import AiCall, ai_calls
from quail.logical.expressions import ColumnRef, OutputColumn
from quail.logical.nodes import Scan
from quail.physical import nodes as ph
from quail.physical.graph import Edge, PhysicalGraph
from quail.planner.oversize import OversizedDocuments
from quail.plugins.registry import ExtensionRegistry
from quail.runtime.coordinator import PreparedQuery, QuerySession, run_candidate
from quail.runtime.explain import explain_text
from quail.runtime.results import QueryResult
from quail.runtime.views import scan_views

TEXT = "doc0"


class EmbeddingQuery:
    """One AI.EMBED lookup: plan(), explain(), run() as a `Query` offers them. The texts are read when it runs (the
    relations it reads are registered then)."""

    def __init__(self, session: QuerySession, lookup: Lookup) -> None:
        self.session = session
        self.lookup = lookup
        self.call = _call(lookup)
        self.model = embedding_model(session.registry, session.config, model_option(self.call))
        self.remarks = (f"embedded by {self.model.name} ({self.model.dimensions} dimensions) on backend "
                        f"{session.backend.name!r}",)

    def _session(self) -> QuerySession:
        return self.session.with_model(self.model)

    def _prepared(self) -> PreparedQuery:
        session = self._session()
        views = scan_views(self._scan(), session.database)
        tokens = {LOOKUP_ALIAS: session.token_store.tokens(views[LOOKUP_ALIAS], TEXT, session.tokenizer)}
        return PreparedQuery(session.database.generation, views, tokens, {}, OversizedDocuments("refuse"))

    def _scan(self) -> Scan:
        """The lookup's distinct texts, NULL left out (an embedding of NULL is NULL: the statement reads no row)."""
        texts = self.lookup.inner.copy()
        texts.set("expressions", [exp.column(TEXT, table=LOOKUP_ALIAS)])
        texts = texts.where(exp.column(TEXT, table=LOOKUP_ALIAS).is_(exp.null()).not_())
        return Scan(table=self.lookup.name, alias=LOOKUP_ALIAS, id_column=None, columns=(TEXT,),
                    source=f"({texts.sql(dialect='duckdb')})")

    def plan(self) -> PhysicalCandidate:
        return self._candidate(self._prepared())

    def _candidate(self, prepared: PreparedQuery) -> PhysicalCandidate:
        model, device = self.model, self.session.device
        node = ph.AiEmbed(id=f"embed_{LOOKUP_ALIAS}", preamble=(), alias=LOOKUP_ALIAS,
                          column=ColumnRef(LOOKUP_ALIAS, TEXT), output=VALUE, dimensions=model.dimensions,
                          context=model.context_length, special_tokens=model.special_tokens)
        lengths = pc.min_element_wise(pc.add(prepared.tokens[LOOKUP_ALIAS].lengths(), model.special_tokens),
                                      model.context_length)
        positions = int(pc.sum(lengths).as_py() or 0)
        seconds = encoder_seconds(model, device, positions)
        node = replace(node, estimate=ph.NodeEstimate(rows=len(lengths), tokens=positions, seconds=seconds))
        graph = _graph(node, self.lookup.name, self.call)
        backend = self.session.backend
        refused = backend.refuse(graph) if isinstance(backend, Backend) else None
        if refused is not None:
            raise RefusalError(refused)
        remarks = (*self.remarks, *_truncation(prepared, model))
        return PhysicalCandidate(self.session.backend.name, graph, self._scan(), seconds, seconds, remarks)

    def explain(self, verbose: bool = False, analyze: bool = False) -> str:
        if analyze:
            return self.run().explain()
        try:
            candidate, refusal = self.plan(), None
        except RefusalError as error:
            candidate, refusal = None, str(error)
        return explain_text(self._scan(), candidate, "by_cost", "none (embeddings)", self.model.name, refusal)

    def run(self) -> QueryResult:
        prepared = self._prepared()
        return run_candidate(self._session(), "by_cost", self._candidate(prepared), prepared)

    def collect(self) -> pa.Table:
        return self.run().collect()


def embedding_model(registry: ExtensionRegistry, config: EngineConfig, named: str | None) -> ModelSpec:
    """The catalog embedding model a call answers with: the one it names (a catalog model or an alias the session
    has checked), else EngineConfig.embedding_model."""
    return registry.model(config.embedding_model if named is None else config.catalog_name(named))


def encoder_seconds(model: ModelSpec, device: DeviceSpec, positions: int) -> float:
    """An encoder's forward pass over `positions` tokens: compute-bound (2 FLOPs per weight per token) at the
    model's precision — fp32 weights on the fp32 peak — plus one read of the weights."""
    precision = "fp32" if model.weight_bytes >= 4 else "bf16"
    flops = 2.0 * model.non_embedding_params * positions
    return flops / device.peak_flops(precision) + model.weight_bytes_total / device.bandwidth_bytes_per_s


def _call(lookup: Lookup) -> AiCall:
    calls = [c for c in ai_calls(lookup.inner) if c.kind == "embed"]
    assert calls, "an embedding lookup's query holds its call"
    return calls[0]


def _graph(node: ph.AiEmbed, table: str, call: AiCall) -> PhysicalGraph:
    """Scan → AiEmbed → the vectors beside the texts → the relational tail: each text and what the call reads as
    (`calls.call_value`: the vector, or BigQuery's STRUCT around it)."""
    scan = ph.Scan(id=f"scan_{LOOKUP_ALIAS}", table=table, alias=LOOKUP_ALIAS)
    recombine = ph.RecombineEmbeddings(id=f"recombine_{LOOKUP_ALIAS}", alias=LOOKUP_ALIAS, output=VALUE)
    rows = rows_relation(0)
    value = call_value(call, exp.column(VALUE, table=OUTPUTS_RELATION, quoted=True))
    statement = (f'SELECT {rows}."{TEXT}" AS "{TEXT}", {value.sql(dialect="duckdb")} AS "{VALUE}" '
                 f"FROM {rows} POSITIONAL JOIN {OUTPUTS_RELATION}")
    project = ph.Project(id="project", columns=(OutputColumn(TEXT, ColumnRef(LOOKUP_ALIAS, TEXT)),
                                                OutputColumn(VALUE)), statement=statement, relations=(LOOKUP_ALIAS,))
    edges = (Edge(scan.id, "rows", node.id, "rows"), Edge(scan.id, "rows", recombine.id, "rows"),
             Edge(node.id, "answers", recombine.id, "answers"), Edge(recombine.id, "rows", project.id, "rows"))
    graph = PhysicalGraph((scan, node, recombine, project), edges, project.id)
    graph.validate()
    return graph


def _truncation(prepared: PreparedQuery, model: ModelSpec) -> tuple[str, ...]:
    """A remark when some texts are longer than the encoder reads (it embeds their beginning, as
    sentence-transformers does)."""
    limit = model.context_length - model.special_tokens
    longer = int(pc.sum(pc.greater(prepared.tokens[LOOKUP_ALIAS].lengths(), limit)).as_py() or 0)
    if not longer:
        return ()
    return (f"{longer:,} text(s) are longer than the {limit} tokens {model.name} reads: each is embedded from its "
            f"first {limit} tokens",)
