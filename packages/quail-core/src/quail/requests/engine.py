"""The role a serving engine plays for the request strategies: token-id prompts in, TRUE/FALSE margins out.

An adapter (VLLMEngine, SGLangEngine) turns its engine's outputs into `EngineAnswer`s, so the
schedulers in `quail.requests.strategies` never see an engine type. Every request asks for one
output token at temperature 0 with the TRUE-like and FALSE-like label log-probabilities; the
margin is max(TRUE) − max(FALSE), the same number the native backend reads from its logits.
The optional roles below add label scores (`ReadsContinuations`), generations (`GeneratesText`)
and, for an engine booted on an embedding model, sentence vectors (`EmbedsText`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from quail.backends.shapes import Finish
from quail.data.tokenizer import TokenIds
from quail.prompts import AnswerTokens


@dataclass(frozen=True)
class EngineRequest:
    """One prompt and the answer tokens whose log-probabilities it asks for; `key` matches the answer."""

    key: int
    tokens: TokenIds
    labels: AnswerTokens


@dataclass(frozen=True)
class EngineAnswer:
    """What the engine said about one request, and how much of its prompt came from the prefix cache."""

    key: int
    margin: float
    prompt_tokens: int
    cached_tokens: int

    @property
    def fresh_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@runtime_checkable
class RequestEngine(Protocol):
    """A booted engine with prefix caching, answering TRUE/FALSE requests."""

    def kv_capacity_tokens(self) -> int:
        """How many tokens of KV the engine holds at once (for fit checks and admission caps)."""
        ...

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineAnswer]:
        """Run a batch to completion; answers in any order."""
        ...

    def submit(self, request: EngineRequest) -> None:
        """Queue one request without waiting (pipelined schedules)."""
        ...

    def step(self) -> list[EngineAnswer]:
        """Advance the engine; the answers of the requests that finished in this step."""
        ...

    def forget_cached_prefixes(self) -> None:
        """Empty the prefix cache: the next requests compute every prefix again (cold-KV benchmarks)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ReadsContinuations(Protocol):
    """Optional for a RequestEngine: what an AI.CLASSIFY label scores — the summed log-probability of each
    continuation's tokens after the prompt (the first read at the prompt's last position, each next one after
    the continuation's tokens before it). An engine with it runs AI.CLASSIFY nodes too."""

    def continuation_logprobs(self, prompt: TokenIds, continuations: Sequence[TokenIds]) -> list[float]: ...


@dataclass(frozen=True)
class EngineGeneration:
    """One greedy generation: the tokens before the first stop token, how it ended, and the prompt's counters."""

    tokens: TokenIds
    finish: Finish
    prompt_tokens: int
    cached_tokens: int

    @classmethod
    def cut(cls, written: Sequence[int], stop: Sequence[int], stopped: bool, prompt_tokens: int,
            cached_tokens: int) -> EngineGeneration:
        """What an engine wrote, cut before its first stop token (engines differ on whether they keep a matched
        one); it ended by itself when a stop token was written or the engine says it `stopped`, else at the bound."""
        ended = next((i for i, token in enumerate(written) if token in stop), None)
        kept = tuple(int(t) for t in (written if ended is None else written[:ended]))
        return cls(kept, "stop" if ended is not None or stopped else "length", prompt_tokens, cached_tokens)


@runtime_checkable
class GeneratesText(Protocol):
    """Optional for a RequestEngine: greedy generations (temperature 0) of at most `max_tokens` tokens, each ending
    before the first of `stop`, held to `grammar` (a JSON Schema's text) when given. An engine with it runs
    AI.GENERATE / AI_COMPLETE / AI_EXTRACT nodes too."""

    def greedy_generations(self, prompts: Sequence[TokenIds], max_tokens: int, stop: TokenIds,
                           grammar: str | None) -> list[EngineGeneration]: ...


@runtime_checkable
class EmbedsText(Protocol):
    """Optional for a RequestEngine booted on an embedding model: one sentence vector per document, pooled and
    normalised as the model's own pooling config says (what sentence-transformers computes). An engine with it
    runs AiEmbed nodes.

    Each document is word-piece ids WITHOUT special tokens (an empty one is valid). The engine keeps its first
    `context - special_tokens` ids and frames them with its encoder's special tokens ([CLS] … [SEP] for BERT), read
    from its own tokenizer, so the encoder reads at most `context` positions — `AiEmbed.context` and
    `AiEmbed.special_tokens`, the numbers the plan counted. An engine whose tokenizer adds another number of
    special tokens raises rather than embed what the plan did not count. Vectors come back in `documents`' order."""

    def embeddings(self, documents: Sequence[TokenIds], context: int, special_tokens: int) -> list[Sequence[float]]: ...


def margin_of(logprobs: dict[int, float], true_ids: Sequence[int], false_ids: Sequence[int]) -> float:
    """max over TRUE-like ids minus max over FALSE-like ids; a missing id is an engine error, said so."""
    missing = [i for i in (*true_ids, *false_ids) if i not in logprobs]
    if missing:
        raise RuntimeError(f"the engine returned no log-probability for answer token ids {missing}")
    return max(logprobs[i] for i in true_ids) - max(logprobs[i] for i in false_ids)
