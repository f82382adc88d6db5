"""A stand-in for `vllm.LLM` that answers with the keyword rule and speaks vLLM's real types.

It takes what the real engine takes (TokensPrompt dicts, SamplingParams, string request ids) and
returns real `vllm.outputs.RequestOutput` / `CompletionOutput` / `Logprob` objects, with
`num_cached_tokens` from a block-level prefix cache. Margins come from a table of exact prompt ids
(filled from the documents and the keyword rule), so a prompt laid out wrongly is a KeyError, not a
silently different answer. It refuses requests the adapter must never send (more than one output
token, sampling, no label log-probabilities), and a `generate` while submitted requests are
still running (the real LLM would return them mixed in).

Booted as an encoder (`pooling=Pooling(...)`, vLLM's pooling runner), it answers `embed` instead, with real
`EmbeddingRequestOutput`s: each vector a deterministic function of the exact prompt ids (`fake_embedding`), so
a document framed or cut wrongly gets another vector; like vLLM it refuses a prompt longer than
`max_model_len`, and `get_tokenizer()` names the [CLS] / [SEP] ids as a BERT tokenizer does.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

from vllm import SamplingParams
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, RequestOutput

from quail.prompts import AnswerTokens

BLOCK = 16
OTHER_LABEL = -30.0
BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class Pooling:
    """What a fake encoder is booted with: its tokenizer's [CLS] / [SEP] ids, its vectors' length, its context."""

    cls_id: int
    sep_id: int
    dimensions: int
    max_model_len: int


def fake_embedding(ids: Sequence[int], dimensions: int) -> list[float]:
    """A unit vector that depends on every id and its position (a different framing or cut, a different vector)."""
    vector = [0.0] * dimensions
    for position, token in enumerate(ids):
        vector[(token * 31 + position * 7) % dimensions] += 1.0 + (token % 13) / 13
        vector[(token + position) % dimensions] -= 0.5
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


@dataclass
class FakeEngine:
    """The parts of `LLM.llm_engine` the adapter uses: add_request / step, the cache config, the core."""

    llm: FakeLLM
    waiting: deque[tuple[str, tuple[int, ...], SamplingParams]] = field(default_factory=deque)
    per_step: int = 3
    peak_waiting: int = 0

    def __post_init__(self) -> None:
        cache = SimpleNamespace(kv_cache_size_tokens=self.llm.capacity, num_gpu_blocks=self.llm.capacity // BLOCK,
                                block_size=BLOCK)
        scheduler = SimpleNamespace(max_num_batched_tokens=BATCHED_TOKENS)
        self.vllm_config = SimpleNamespace(cache_config=cache, scheduler_config=scheduler)
        self.engine_core = SimpleNamespace(shutdown=self.llm.shutdown)

    def add_request(self, request_id: str, prompt: dict[str, list[int]], params: SamplingParams) -> str:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id)}")
        if any(r == request_id for r, _, _ in self.waiting):
            raise ValueError(f"request id {request_id} is already running")
        self.waiting.append((request_id, self.llm.check(prompt, params), params))
        self.peak_waiting = max(self.peak_waiting, len(self.waiting))
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting)

    def step(self) -> list[RequestOutput]:
        done = [self.waiting.popleft() for _ in range(min(self.per_step, len(self.waiting)))]
        return [self.llm.answer(request_id, tokens, params) for request_id, tokens, params in done]


class FakeLLM:
    def __init__(self, margins: dict[tuple[int, ...], float], labels: AnswerTokens, capacity: int = 1 << 20,
                 pooling: Pooling | None = None) -> None:
        self.margins = margins
        self.labels = labels
        self.capacity = capacity
        self.pooling = pooling
        self.cached_blocks: set[tuple[int, ...]] = set()
        self.llm_engine = FakeEngine(self)
        self.prompts: list[tuple[int, ...]] = []
        self.embedded: list[tuple[int, ...]] = []
        self.embed_calls = 0
        self.closed = False

    def shutdown(self) -> None:
        self.closed = True

    def reset_prefix_cache(self) -> bool:
        """As `LLM.reset_prefix_cache`: every cached block is dropped."""
        self.cached_blocks.clear()
        return True

    def get_tokenizer(self) -> SimpleNamespace:
        """The parts of a BERT tokenizer the encoder adapter reads (an encoder's only)."""
        pooling = self.encoder()
        return SimpleNamespace(cls_token_id=pooling.cls_id, sep_token_id=pooling.sep_id,
                               num_special_tokens_to_add=lambda pair=False: 4 if pair else 2)

    def encoder(self) -> Pooling:
        if self.pooling is None:
            raise ValueError("embed() needs a pooling model (runner='pooling'); this engine generates")
        return self.pooling

    def embed(self, prompts: Sequence[dict[str, list[int]]], *, use_tqdm: bool = True,
              pooling_params: object = None) -> list[EmbeddingRequestOutput]:
        """As `LLM.embed` on token-id prompts: one pooled, normalised vector per prompt, in the prompts' order."""
        pooling = self.encoder()
        if self.closed:
            raise RuntimeError("the engine was shut down")
        if pooling_params is not None:
            raise AssertionError("the adapter must leave pooling to the model's own config")
        self.embed_calls += 1
        outputs = []
        for index, prompt in enumerate(prompts):
            ids = prompt["prompt_token_ids"]
            if not ids or not all(isinstance(i, int) for i in ids):
                raise ValueError("prompt_token_ids must be a non-empty list of ints")
            if len(ids) > pooling.max_model_len:
                raise ValueError(f"This model's maximum context length is {pooling.max_model_len} tokens. However, "
                                 f"your prompt contains at least {len(ids)} input tokens")
            self.embedded.append(tuple(ids))
            outputs.append(EmbeddingRequestOutput(str(index), EmbeddingOutput(fake_embedding(ids, pooling.dimensions)),
                                                  list(ids), 0, True))
        return outputs

    def check(self, prompt: dict[str, list[int]], params: SamplingParams) -> tuple[int, ...]:
        if self.closed:
            raise RuntimeError("the engine was shut down")
        ids = prompt["prompt_token_ids"]
        if not ids or not all(isinstance(i, int) for i in ids):
            raise ValueError("prompt_token_ids must be a non-empty list of ints")
        if params.max_tokens != 1 or params.temperature != 0:
            raise AssertionError(f"one greedy token expected, got max_tokens={params.max_tokens}, "
                                 f"temperature={params.temperature}")
        if not params.logprob_token_ids or params.logprobs != len(params.logprob_token_ids):
            raise AssertionError("the label log-probabilities must be requested with logprob_token_ids")
        if sorted(params.logprob_token_ids) != sorted({*self.labels.true_ids, *self.labels.false_ids}):
            raise AssertionError(f"asked for label ids {params.logprob_token_ids}, expected {self.labels}")
        return tuple(ids)

    def generate(self, prompts: list[dict[str, list[int]]], sampling_params: list[SamplingParams], *,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        if self.llm_engine.has_unfinished_requests():
            raise AssertionError("generate() while submitted requests run: vLLM would return them mixed in")
        if len(prompts) != len(sampling_params):
            raise ValueError("one SamplingParams per prompt, or a single one")
        checked = [self.check(p, s) for p, s in zip(prompts, sampling_params, strict=True)]
        return [self.answer(str(i), ids, s) for i, (ids, s) in enumerate(zip(checked, sampling_params, strict=True))]

    def answer(self, request_id: str, ids: tuple[int, ...], params: SamplingParams) -> RequestOutput:
        self.prompts.append(ids)
        margin = self.margins[ids]
        values = {token: OTHER_LABEL for token in params.logprob_token_ids or ()}
        best_true, best_false = self.labels.true_ids[-1], self.labels.false_ids[-1]
        values[best_true] = -1.0 + margin / 2
        values[best_false] = -1.0 - margin / 2
        chosen = best_true if margin > 0 else best_false
        logprobs = [{token: Logprob(value, rank=None) for token, value in values.items()}]
        completion = CompletionOutput(0, "", [chosen], values[chosen], logprobs, finish_reason="length")
        return RequestOutput(request_id, None, list(ids), None, [completion], True,
                             num_cached_tokens=self.cache(ids))

    def cache(self, ids: tuple[int, ...]) -> int:
        """Tokens served from full cached blocks (at least one token is always computed), then cache this prompt."""
        hit = 0
        while hit + BLOCK < len(ids) and ids[: hit + BLOCK] in self.cached_blocks:
            hit += BLOCK
        for end in range(BLOCK, len(ids) + 1, BLOCK):
            self.cached_blocks.add(ids[:end])
        return hit
