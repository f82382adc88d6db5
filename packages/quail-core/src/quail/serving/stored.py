"""CachedExecution: the ModelExecution the shared serving path hands the runner, in front of the backend's.

For each model node it keys every item by its prompt token ids, reads what the answer store
holds, gives identical prompts one computation, and sends the backend only what is left — the
same node with fewer rows, tuples or stages, so prompts (and answers) are exactly the ones it
would have computed. What the backend answers is stored in batches committed after each call,
and calls are bounded (`COMMIT_PASSES` forward passes of tokens), so a query killed part-way
keeps what it finished. The backend is booted only when something is left to compute.

Answers merge back into the standard Arrow shapes (`filters`, `joins`, `outputs`); the node's
metrics add up the backend's calls and count answers stored, computed and copied between
duplicates (`node_run`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from quail.backends.base import ModelExecution, NodeInputs, NodeOutput
from quail.cache.access import StoredAnswerAccess
from quail.physical import nodes as ph
from quail.progress import reporting
from quail.serving.embeddings import answer_embeddings
from quail.serving.filters import answer_filter
from quail.serving.generations import answer_generations
from quail.serving.joins import answer_join
from quail.serving.node_run import NodeRun
from quail.serving.outputs import answer_outputs

COMMIT_PASSES = 8
"""A backend call (and so a committed batch of answers) covers at most this many forward passes of prompt tokens."""


class CachedExecution:
    """Answers model nodes from the store where it can, from the backend (booted on first need) where not."""

    def __init__(self, start: Callable[[], ModelExecution], access: StoredAnswerAccess, chunk_tokens: int,
                 backend_name: str = "?") -> None:
        self._start = start
        self.backend_name = backend_name
        self._backend: ModelExecution | None = None
        self.access = access
        self.commit_tokens: int | None = chunk_tokens * COMMIT_PASSES if access.active else None
        self.progress: Callable[[int, int], None] | None = None

    def set_progress(self, callback: Callable[[int, int], None] | None) -> None:
        self.progress = callback

    def close(self) -> None:
        """Nothing to release: the backend's engine belongs to the serving layer's runtime state."""

    def backend(self) -> ModelExecution:
        if self._backend is None:
            self._backend = self._start()
        return self._backend

    def execute(self, node: ph.PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        started = time.perf_counter()
        run = NodeRun(self, node)
        if isinstance(node, ph.AiFilter):
            table = answer_filter(node, inputs, run)
        elif isinstance(node, ph.AiJoin):
            table = answer_join(node, inputs, run)
        elif isinstance(node, ph.AiClassify | ph.AiScore):
            table = answer_outputs(node, inputs, run)
        elif isinstance(node, ph.AiGenerate):
            table = answer_generations(node, inputs, run)
        elif isinstance(node, ph.AiEmbed):
            table = answer_embeddings(node, inputs, run)
        else:  # a backend's own model node: its items are not known here, so it runs as it is
            backend = self.backend()
            with reporting(backend, self.progress):
                return backend.execute(node, inputs)
        return NodeOutput({"answers": table}, run.metrics(time.perf_counter() - started, inputs, table))
