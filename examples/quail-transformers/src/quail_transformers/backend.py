"""The backend (what Quail plans and boots) and its engine (what answers each prompt)."""

from __future__ import annotations

import importlib.util
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from quail.extend import (
    DeviceSpec,
    EngineAnswer,
    EngineRequest,
    GpuContext,
    ModelSpec,
    RequestBackend,
    RequestEngine,
    RequestStrategy,
    SupportResult,
    TokenIds,
    local_model_directory,
    margin_of,
)

if TYPE_CHECKING:
    import torch

STRATEGY = RequestStrategy(filters="operator", joins="anchor_major")
"""Without a prefix cache, no schedule saves work: the simplest ones."""


class TransformersBackend(RequestBackend):
    """Any catalog model transformers can load, on the CPU, in float32."""

    reads_labels = True

    def __init__(self) -> None:
        super().__init__("transformers", STRATEGY, boot)

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
        if missing:
            return SupportResult.reject(f"{' and '.join(missing)} not installed: pip install {' '.join(missing)}")
        if device.kind != "cpu":
            return SupportResult.reject("this example backend runs on the CPU only")
        return super().supports(model, device, gpu_count)  # the checkpoint is on this machine


def boot(context: GpuContext) -> RequestEngine:
    return TransformersEngine(context.model)


class TransformersEngine:
    """One forward per prompt: the next-token log-probabilities at its last position."""

    def __init__(self, model: ModelSpec) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        directory = local_model_directory(model)
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        self.context_tokens = int(getattr(self.model.config, "max_position_embeddings", 8192))
        self.queued: deque[EngineRequest] = deque()

    def log_probabilities(self, ids: Sequence[int]) -> torch.Tensor:
        """[len(ids), vocabulary] log-probabilities of the next token after each prefix of `ids`."""
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([list(ids)])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    def answer(self, request: EngineRequest) -> EngineAnswer:
        last = self.log_probabilities(request.tokens)[-1]
        wanted = (*request.labels.true_ids, *request.labels.false_ids)
        margin = margin_of({i: float(last[i]) for i in wanted}, request.labels.true_ids, request.labels.false_ids)
        return EngineAnswer(request.key, margin, len(request.tokens), 0)

    def continuation_logprobs(self, prompt: TokenIds, continuations: Sequence[TokenIds]) -> list[float]:
        """Σ_j log p(c[j] | prompt + c[:j]) for each continuation c: one forward of prompt + c."""
        scores = []
        for continuation in continuations:
            rows = self.log_probabilities((*prompt, *continuation))
            scores.append(sum(float(rows[len(prompt) - 1 + j, token]) for j, token in enumerate(continuation)))
        return scores

    # -- the rest of the RequestEngine role ---------------------------------------------------

    def kv_capacity_tokens(self) -> int:
        return self.context_tokens

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineAnswer]:
        return [self.answer(request) for request in requests]

    def submit(self, request: EngineRequest) -> None:
        self.queued.append(request)

    def step(self) -> list[EngineAnswer]:
        return [self.answer(self.queued.popleft())] if self.queued else []

    def forget_cached_prefixes(self) -> None:
        """Nothing to forget: no KV outlives a prompt."""

    def close(self) -> None:
        self.queued.clear()
