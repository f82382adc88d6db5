"""SGLangEngine: `sglang.Engine` in the `RequestEngine` role — token-id prompts in, TRUE/FALSE margins out.

Every request is `input_ids` with one new token at temperature 0 (SGLang samples greedily then and
reports log-probabilities of the raw logits), `return_logprob=True` and `token_ids_logprob` set to
the TRUE-like and FALSE-like first tokens: the margin is read from `meta_info
["output_token_ids_logprobs"]`, never from the sampled token, so no logit bias is needed to force
the answer. `logprob_start_len` is the prompt length: no prompt log-probabilities, because a start
inside the prompt caps how much of it the radix cache may serve. `meta_info["cached_tokens"]` says
how much of a prompt came from the radix cache. Only public SGLang names are used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quail.extend import AnswerTokens, EngineAnswer, EngineGeneration, EngineRequest, TokenIds, margin_of

if TYPE_CHECKING:
    from sglang import Engine

ONE_GREEDY_TOKEN = {"max_new_tokens": 1, "temperature": 0.0}
"""SGLang sampling params (keys of `sglang.srt.sampling.sampling_params.SamplingParams`)."""

Output = Mapping[str, object]
"""One request's output dict: `output_ids`, `meta_info` (and `text` unless the tokenizer is skipped)."""


@dataclass(frozen=True)
class EngineSettings:
    """What sglang.Engine is booted with (ServerArgs names); None leaves a value to SGLang.

    `kv_tokens` is `max_total_tokens` (the KV pool in tokens); without it SGLang sizes the pool
    from `mem_fraction_static` of the GPU.
    """

    model_dir: Path
    dtype: str = "auto"
    kv_tokens: int | None = None
    kv_fraction: float | None = None
    context_length: int | None = None
    seed: int = 0

    def server_args(self) -> dict[str, str | int | float | bool]:
        """Keyword arguments of `sglang.Engine`: the radix cache on, token ids in and out (no detokenizer)."""
        args: dict[str, str | int | float | bool] = {
            "model_path": str(self.model_dir), "dtype": self.dtype, "disable_radix_cache": False,
            "skip_tokenizer_init": True, "random_seed": self.seed, "log_level": "error",
        }
        optional = {"max_total_tokens": self.kv_tokens, "mem_fraction_static": self.kv_fraction,
                    "context_length": self.context_length}
        args.update({name: value for name, value in optional.items() if value is not None})
        return args


class SGLangEngine:
    """A booted sglang.Engine answering TRUE/FALSE requests; `close()` shuts its subprocesses down.

    Pipelined requests are `async_generate` tasks on the engine's own event loop (`Engine.loop`,
    the loop its blocking `generate` runs on too), so both share one tokenizer manager.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._pending: dict[asyncio.Task[Output], EngineRequest] = {}
        self._capacity: int | None = None
        self._closed = False

    @classmethod
    def boot(cls, settings: EngineSettings) -> SGLangEngine:
        import sglang

        return cls(sglang.Engine(**settings.server_args()))

    # -- the RequestEngine role -----------------------------------------------------------------

    def kv_capacity_tokens(self) -> int:
        """The KV pool in tokens: `max_total_num_tokens` of the server info (read once, it is fixed at boot)."""
        if self._capacity is None:
            info = self.engine.get_server_info()
            tokens = info.get("max_total_num_tokens")
            if not isinstance(tokens, int) or tokens <= 0:
                raise RuntimeError(f"SGLang reports no KV pool size (max_total_num_tokens = {tokens!r})")
            self._capacity = tokens
        return self._capacity

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineAnswer]:
        if not requests:
            return []
        outputs = self.engine.generate(
            input_ids=[list(r.tokens) for r in requests], sampling_params=dict(ONE_GREEDY_TOKEN),
            return_logprob=True, logprob_start_len=[len(r.tokens) for r in requests],
            token_ids_logprob=[_label_ids(r.labels) for r in requests],
        )
        if not isinstance(outputs, list) or len(outputs) != len(requests):
            raise RuntimeError(f"SGLang answered a batch of {len(requests)} with {type(outputs).__name__}")
        return [_answer(r, output) for r, output in zip(requests, outputs, strict=True)]

    def submit(self, request: EngineRequest) -> None:
        coroutine = self.engine.async_generate(
            input_ids=list(request.tokens), sampling_params=dict(ONE_GREEDY_TOKEN), return_logprob=True,
            logprob_start_len=len(request.tokens), token_ids_logprob=_label_ids(request.labels),
        )
        self._pending[self.engine.loop.create_task(coroutine)] = request

    def step(self) -> list[EngineAnswer]:
        """Run the engine's loop until at least one submitted request has finished; their answers."""
        if not self._pending:
            return []
        done, _ = self.engine.loop.run_until_complete(
            asyncio.wait(set(self._pending), return_when=asyncio.FIRST_COMPLETED))
        return [_answer(self._pending.pop(task), task.result()) for task in done]

    # -- the GeneratesText role -----------------------------------------------------------------

    def greedy_generations(self, prompts: Sequence[TokenIds], max_tokens: int, stop: TokenIds,
                           grammar: str | None) -> list[EngineGeneration]:
        """One batch: temperature 0, at most `max_tokens` new tokens, ending at a stop token id, held to the JSON
        Schema `grammar` by SGLang's grammar backend when given (`json_schema`)."""
        if not prompts:
            return []
        params: dict[str, object] = {"max_new_tokens": max_tokens, "temperature": 0.0, "stop_token_ids": list(stop),
                                     "skip_special_tokens": False}
        if grammar is not None:
            params["json_schema"] = grammar
        outputs = self.engine.generate(input_ids=[list(p) for p in prompts], sampling_params=params)
        if not isinstance(outputs, list) or len(outputs) != len(prompts):
            raise RuntimeError(f"SGLang answered a batch of {len(prompts)} with {type(outputs).__name__}")
        return [_generation(output, stop) for output in outputs]

    def forget_cached_prefixes(self) -> None:
        """Flush the radix cache (`Engine.flush_cache`): the next requests compute every prefix again."""
        self.engine.flush_cache()

    def close(self) -> None:
        """Cancel what is still in flight and shut the engine's scheduler and detokenizer down."""
        if self._closed:
            return
        self._closed = True
        for task in self._pending:
            task.cancel()
        self._pending.clear()
        self.engine.shutdown()


def _label_ids(labels: AnswerTokens) -> list[int]:
    return [*labels.true_ids, *labels.false_ids]


def _answer(request: EngineRequest, output: Output) -> EngineAnswer:
    """The margin from the first output position's label log-probabilities, and the cache counters."""
    meta = output.get("meta_info")
    if not isinstance(meta, Mapping):
        raise RuntimeError(f"SGLang returned no meta_info for request {request.key}")
    positions = meta.get("output_token_ids_logprobs")
    if not isinstance(positions, list) or not positions or not positions[0]:
        raise RuntimeError(f"SGLang returned no label log-probabilities for request {request.key}")
    logprobs = {int(token): float(value) for value, token, *_ in positions[0]}
    margin = margin_of(logprobs, request.labels.true_ids, request.labels.false_ids)
    return EngineAnswer(request.key, margin, int(meta["prompt_tokens"]), int(meta.get("cached_tokens") or 0))


def _generation(output: Output, stop: TokenIds) -> EngineGeneration:
    """SGLang's output (it keeps a matched stop token id in `output_ids`; meta_info's finish_reason says stop or
    length) as a generation, with the prompt's cache counters."""
    meta = output.get("meta_info")
    ids = output.get("output_ids")
    if not isinstance(meta, Mapping) or not isinstance(ids, list):
        raise RuntimeError("SGLang returned a generation without output_ids or meta_info")
    reason = meta.get("finish_reason")
    stopped = isinstance(reason, Mapping) and reason.get("type") == "stop"
    return EngineGeneration.cut(ids, stop, stopped, int(meta["prompt_tokens"]), int(meta.get("cached_tokens") or 0))
