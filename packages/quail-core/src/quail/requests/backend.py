"""What every request backend does the same way, whichever engine it drives.

A request backend (vLLM, SGLang) differs from another only in how it boots its engine and what it
asks of the machine. Planning (the native planner's decisions, so comparisons between backends
compare execution), the checkpoint's tokenizer and the shared worker side come from `Backend`; the
node-by-node execution as TRUE/FALSE requests is here, so an adapter package is a `supports` check,
a boot function and an engine adapter. An embedding model (a sentence-transformers folder) gets its own
tokenizer and identity here too: its ids carry no special tokens (the engine adds them), and its vectors are
a function of the weights, the tokenizer and the pooling settings the folder holds.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from quail.backends.base import (
    GpuContext,
    ModelExecution,
)
from quail.backends.default import Backend
from quail.errors import Refusal
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.requests.engine import RequestEngine
from quail.requests.execution import GENERATION_NODES, LABEL_NODES, REQUEST_NODES, RequestModelExecution
from quail.requests.strategies import RequestStrategy

EngineFactory = Callable[[GpuContext], RequestEngine]


def installed(distribution: str) -> bool:
    """Whether a distribution is installed, without importing it (an engine import can take seconds)."""
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


class RequestBackend(Backend):
    """The backend contract for an engine behind `RequestEngine`; a subclass says what it supports.

    `boot` makes the engine (a fake one in tests). Two request backends with the same name,
    strategy and boot function are equal, so they share a booted engine across sessions.
    """

    reads_labels = False
    """Whether the engine `ReadsContinuations`, so AI.CLASSIFY is planned rather than refused."""
    generates = False
    """Whether the engine `GeneratesText`, so AI.GENERATE / AI_COMPLETE are planned rather than refused."""
    embeds = False
    """Whether an embedding model's engine `EmbedsText`, so AI.EMBED / AI.SIMILARITY are planned rather than refused."""

    def __init__(self, name: str, strategy: RequestStrategy, boot: EngineFactory) -> None:
        self.name = name
        self.strategy = strategy
        self.boot = boot

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, RequestBackend) and \
            (other.name, other.strategy, other.boot) == (self.name, self.strategy, self.boot)

    def __hash__(self) -> int:
        return hash((type(self), self.name, self.strategy, self.boot))

    def refuse(self, graph: PhysicalGraph) -> Refusal | None:
        """AI.CLASSIFY and any node kind beyond one TRUE/FALSE request per prompt are refused at planning."""
        runs = (*(LABEL_NODES if self.reads_labels else REQUEST_NODES), *(GENERATION_NODES if self.generates else ()),
                *((ph.AiEmbed,) if self.embeds else ()))
        return _refusal(graph, runs)

    def start(self, context: GpuContext) -> ModelExecution:
        """Boot the engine (timed as the query's boot); it lives as long as the worker keeps it."""
        return RequestModelExecution(self.boot(context), self.strategy, self.name)


def _refusal(graph: PhysicalGraph, runs: tuple[type[ph.PhysicalNode], ...]) -> Refusal | None:
    for node in graph.nodes:
        if isinstance(node, ph.AiClassify) and ph.AiClassify not in runs:
            return Refusal(
                "the request backends do not run AI.CLASSIFY",
                (f"{node.describe()}: a label's score is the summed log-probability of its whole continuation, "
                 "which one TRUE/FALSE request per document cannot read",),
                hints=("run classification on the native backend",),
            )
        if isinstance(node, ph.AiEmbed) and ph.AiEmbed not in runs:
            return Refusal(f"this request backend's engine embeds no text: {node.describe()}",
                           hints=("run embeddings on the native backend",))
        if node.is_model_node and not isinstance(node, runs):
            return Refusal(f"the request backends cannot run {node.kind} {node.id!r}")
    return None
