"""VLLMEngine: `vllm.LLM` in the `RequestEngine` role — token-id prompts in, TRUE/FALSE margins out.

One output token at temperature 0, with the log-probabilities of exactly the TRUE-like and
FALSE-like first tokens (`logprob_token_ids`), so margins are the same numbers the native backend
reads from its logits. Prefix caching is on: `num_cached_tokens` of each output says how much of the
prompt the engine did not compute again. Only public vLLM names are used.

`VLLMEncoder` is the same role for an embedding model: vLLM's pooling runner in float32, which mean-pools and
normalises as the sentence-transformers folder says (modules.json, 1_Pooling); it answers AiEmbed nodes only.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from quail.extend import AnswerTokens, EngineAnswer, EngineGeneration, EngineRequest, TokenIds, margin_of

if TYPE_CHECKING:
    from vllm import LLM, RequestOutput, SamplingParams

ENCODER_KV_BYTES = 64 << 20
"""The KV cache asked of an encoder engine: an encoder keeps no KV between requests, but vLLM sizes a cache all the
same, and a fixed size spares the CPU build its memory-profiling warmup."""
ENCODER_MEMORY_FRACTION = 0.05
"""An encoder's `gpu_memory_utilization`: the CUDA build checks that this fraction of the device is free when it
boots, and the generative engine beside it holds most of the device."""


@dataclass(frozen=True)
class EngineSettings:
    """What vllm.LLM is booted with: the KV cache in bytes when given, else a memory fraction.

    `kv_fraction` is vLLM's `gpu_memory_utilization`; on the CPU build it is a fraction of the NUMA
    node's RAM for the whole engine, so a fixed `kv_bytes` is the safer choice there.
    """

    model_dir: Path
    dtype: str = "auto"
    kv_bytes: int | None = None
    kv_fraction: float = 0.5
    max_model_len: int | None = None
    block_size: int | None = None
    enforce_eager: bool = True
    seed: int = 0


@dataclass(frozen=True)
class EncoderSettings:
    """What vllm.LLM is booted with for an embedding model: the pooling runner in float32, prompts of at most
    `max_model_len` positions (the model's context, special tokens included)."""

    model_dir: Path
    max_model_len: int
    kv_bytes: int = ENCODER_KV_BYTES
    kv_fraction: float = ENCODER_MEMORY_FRACTION
    enforce_eager: bool = True
    seed: int = 0


class _Logprob(Protocol):
    logprob: float


class _Booted:
    """A booted vllm.LLM that `close()` shuts down: its engine core stopped and the model dropped, so a later engine
    gets the memory back."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None:  # the in-process engine core too: its memory and threads go back
            core.shutdown()
        del self.llm
        gc.collect()


class VLLMEngine(_Booted):
    """A booted vllm.LLM answering TRUE/FALSE requests; `close()` shuts its engine core down."""

    def __init__(self, llm: LLM) -> None:
        super().__init__(llm)
        self._params: dict[AnswerTokens, SamplingParams] = {}
        self._labels: dict[int, AnswerTokens] = {}

    def params(self, labels: AnswerTokens) -> SamplingParams:
        """One output token at temperature 0, with exactly the answer tokens' log-probabilities."""
        from vllm import SamplingParams

        if labels not in self._params:
            ids = [*labels.true_ids, *labels.false_ids]
            self._params[labels] = SamplingParams(max_tokens=1, temperature=0.0, logprobs=len(ids),
                                                  logprob_token_ids=ids)
        return self._params[labels]

    @classmethod
    def boot(cls, settings: EngineSettings) -> VLLMEngine:
        """Start vLLM in this process (no engine-core subprocess) with prefix caching on."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        llm = LLM(model=str(settings.model_dir), dtype=settings.dtype, enable_prefix_caching=True,
                  gpu_memory_utilization=settings.kv_fraction, kv_cache_memory_bytes=settings.kv_bytes,
                  max_model_len=settings.max_model_len, block_size=settings.block_size,
                  enforce_eager=settings.enforce_eager, seed=settings.seed, skip_tokenizer_init=False,
                  structured_outputs_config={"backend": "guidance"})
        return cls(llm)

    # -- the RequestEngine role -----------------------------------------------------------------

    def kv_capacity_tokens(self) -> int:
        """The engine's KV cache in tokens, from its cache config (set when the cache was allocated)."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        tokens = getattr(cache, "kv_cache_size_tokens", None)
        if tokens:
            return int(tokens)
        if cache.num_gpu_blocks:
            return int(cache.num_gpu_blocks) * int(cache.block_size)
        raise RuntimeError("vLLM reports no KV cache size (cache_config.num_gpu_blocks is unset)")

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineAnswer]:
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(r.tokens)) for r in requests],
                                    [self.params(r.labels) for r in requests], use_tqdm=False)
        return [self._answer(r.key, r.labels, output) for r, output in zip(requests, outputs, strict=True)]

    def submit(self, request: EngineRequest) -> None:
        from vllm.inputs import TokensPrompt

        self._labels[request.key] = request.labels
        self.llm.llm_engine.add_request(str(request.key), TokensPrompt(prompt_token_ids=list(request.tokens)),
                                        self.params(request.labels))

    def step(self) -> list[EngineAnswer]:
        finished = [output for output in self.llm.llm_engine.step() if output.finished]
        answers = []
        for output in finished:
            key = int(output.request_id)
            answers.append(self._answer(key, self._labels.pop(key), output))
        return answers

    def forget_cached_prefixes(self) -> None:
        self.llm.reset_prefix_cache()

    # -- the GeneratesText role -----------------------------------------------------------------

    def greedy_generations(self, prompts: Sequence[TokenIds], max_tokens: int, stop: TokenIds,
                           grammar: str | None) -> list[EngineGeneration]:
        """Temperature 0, at most `max_tokens`, ending at the first stop token (which vLLM leaves out of
        `token_ids` unless asked to include it; it is dropped here either way); held to the JSON Schema `grammar`
        through vLLM's structured outputs, compiled by llguidance as on the native backend (`boot`)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import StructuredOutputsParams

        if not prompts:
            return []
        held = StructuredOutputsParams(json=grammar) if grammar is not None else None
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=list(stop),
                                skip_special_tokens=False, detokenize=False, structured_outputs=held)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    use_tqdm=False)
        return [EngineGeneration.cut(list(output.outputs[0].token_ids), stop, output.outputs[0].finish_reason == "stop",
                                     len(output.prompt_token_ids or ()), output.num_cached_tokens or 0)
                for output in outputs]

    # -- reading outputs ------------------------------------------------------------------------

    def _answer(self, key: int, labels: AnswerTokens, output: RequestOutput) -> EngineAnswer:
        completion = output.outputs[0]
        if not completion.logprobs:
            raise RuntimeError(f"vLLM returned no log-probabilities for request {key}")
        first: dict[int, _Logprob] = completion.logprobs[0]
        margin = margin_of({token: lp.logprob for token, lp in first.items()}, labels.true_ids, labels.false_ids)
        prompt = len(output.prompt_token_ids or ())
        cached = output.num_cached_tokens or 0
        return EngineAnswer(key, margin, prompt, cached)


class VLLMEncoder(_Booted):
    """A booted vllm.LLM on an embedding model, in the `RequestEngine` role with `EmbedsText`.

    Each document is framed with the encoder's special tokens, taken from vLLM's own tokenizer of the model (its
    [CLS] and [SEP]), and cut to the context, so every prompt fits vLLM's `max_model_len` (vLLM refuses a longer
    one rather than truncate it). An encoder answers no TRUE/FALSE request and keeps no prefix cache.
    """

    def __init__(self, llm: LLM) -> None:
        super().__init__(llm)
        tokenizer = llm.get_tokenizer()
        first, last = getattr(tokenizer, "cls_token_id", None), getattr(tokenizer, "sep_token_id", None)
        if not isinstance(first, int) or not isinstance(last, int):
            raise ValueError(f"the encoder's tokenizer names no [CLS] / [SEP] token (cls_token_id={first!r}, "
                             f"sep_token_id={last!r}): this adapter frames documents with them")
        added = tokenizer.num_special_tokens_to_add()
        if added != 2:
            raise ValueError(f"the encoder's tokenizer adds {added} special tokens to a text; this adapter frames "
                             "documents with [CLS] … [SEP] (2)")
        self.cls_id, self.sep_id, self.special_tokens = first, last, added

    @classmethod
    def boot(cls, settings: EncoderSettings) -> VLLMEncoder:
        """Start vLLM's pooling runner in this process, in float32. No prefix caching: vLLM refuses it for an
        encoder (no attention layer keeps KV), and every document is computed whole anyway."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        llm = LLM(model=str(settings.model_dir), runner="pooling", dtype="float32", enable_prefix_caching=False,
                  max_model_len=settings.max_model_len, kv_cache_memory_bytes=settings.kv_bytes,
                  gpu_memory_utilization=settings.kv_fraction, enforce_eager=settings.enforce_eager,
                  seed=settings.seed, skip_tokenizer_init=False)
        return cls(llm)

    # -- the EmbedsText role --------------------------------------------------------------------

    def embeddings(self, documents: Sequence[TokenIds], context: int, special_tokens: int) -> list[Sequence[float]]:
        """[CLS] + the first `context - special_tokens` ids + [SEP] for each document, one `embed` batch (vLLM
        schedules it); the pooled, normalised vectors in the documents' order."""
        from vllm.inputs import TokensPrompt

        if special_tokens != self.special_tokens:
            raise ValueError(f"the plan counts {special_tokens} special tokens per document; this encoder adds "
                             f"{self.special_tokens}")
        keep = context - special_tokens
        if keep < 0:
            raise ValueError(f"a context of {context} positions holds no {special_tokens} special tokens")
        if not documents:
            return []
        prompts = [TokensPrompt(prompt_token_ids=[self.cls_id, *map(int, document[:keep]), self.sep_id])
                   for document in documents]
        outputs = self.llm.embed(prompts, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM answered {len(prompts)} embedding requests with {len(outputs)} outputs")
        vectors: list[Sequence[float]] = []
        for index, output in enumerate(outputs):
            error = getattr(output, "error", None)
            if error is not None:
                raise RuntimeError(f"vLLM could not embed document {index}: {error}")
            vectors.append(output.outputs.embedding)
        return vectors

    # -- the RequestEngine role -----------------------------------------------------------------

    def kv_capacity_tokens(self) -> int:
        """The tokens the encoder computes in one step (it keeps no KV between requests)."""
        return int(self.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineAnswer]:
        if not requests:
            return []
        raise RuntimeError("an embedding engine answers no TRUE/FALSE requests")

    def submit(self, request: EngineRequest) -> None:
        raise RuntimeError("an embedding engine answers no TRUE/FALSE requests")

    def step(self) -> list[EngineAnswer]:
        return []

    def forget_cached_prefixes(self) -> None:
        """Nothing to forget: the encoder keeps no prefix cache."""

