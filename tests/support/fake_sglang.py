"""A stand-in for `sglang.Engine` (0.5.x) that answers with the keyword rule and speaks SGLang's real API.

SGLang's PyPI build cannot run on a CPU machine, so this fake copies what its source
(`sglang/srt/entrypoints/engine.py`, `managers/io_struct.py`, `managers/tokenizer_manager.py`,
`managers/scheduler.py`, `sampling/sampling_params.py` of sglang 0.5.23) says the engine takes and
returns, and refuses what it refuses:

* `Engine(**server_args)` — unknown server-arg names are a TypeError (ServerArgs is a msgspec struct);
* `generate` / `async_generate` with the same keyword names; `input_ids` a list of ints (one
  request) or a list of such lists (a batch, answered as a list in input order); `sampling_params`
  a dict or one per request, whose keys must be SamplingParams fields and whose values pass its
  `verify`; `token_ids_logprob` a flat list of in-vocabulary ints per request; a
  `logprob_start_len` past the prompt is a ValueError, as the scheduler's abort is to the caller;
  so is a prompt of `max_req_input_len` tokens or more (min(context − 1, KV pool − 1) − 5);
* outputs `{"output_ids": [...], "meta_info": {...}}` (plus `"text"` when the tokenizer is not
  skipped) with `id`, `finish_reason` `{"type": "length", "length": 1}`, `prompt_tokens`,
  `completion_tokens`, `cached_tokens`, `output_token_logprobs` and `output_token_ids_logprobs` as
  lists of `(logprob, token_id, None)` per output position;
* `get_server_info()` with `max_total_num_tokens`; `shutdown()`; `loop`, the event loop both
  generate paths run on (an `async_generate` awaited on another loop is refused, as the real one
  would hang there).

Requests run in scheduler waves of `per_step`; a prompt's KV enters the radix tree when its request
finishes (after its wave), so `cached_tokens` is the longest cached prefix at the wave's start,
capped at the prompt length − 1 (and at `logprob_start_len` when prompt log-probabilities are
asked for), as the scheduler does. Margins come from a table of exact prompt ids. It also refuses
what the adapter must never send: more than one new token, sampling, no label log-probabilities.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from quail.prompts import AnswerTokens

OTHER_LABEL = -30.0
SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
    "custom_params", "watermark",
})
"""The API fields of sglang.srt.sampling.sampling_params.SamplingParams."""
SERVER_ARGS = frozenset({
    "model_path", "tokenizer_path", "dtype", "context_length", "mem_fraction_static", "max_total_tokens",
    "max_running_requests", "page_size", "disable_radix_cache", "skip_tokenizer_init", "random_seed",
    "log_level", "device", "tp_size", "chunked_prefill_size", "trust_remote_code", "load_format",
})
"""A subset of ServerArgs field names (arg_groups/fields/*): the ones a Quail adapter may set."""


@dataclass
class _Request:
    rid: str
    ids: tuple[int, ...]
    params: dict[str, object]
    start: int
    label_ids: list[int] | None
    single: bool = False
    done: asyncio.Future[dict[str, object]] = field(repr=False, default=None)  # type: ignore[assignment]


class FakeSGLang:
    """`sglang.Engine` over a margin table, with a token-level radix cache of the finished prompts."""

    def __init__(self, margins: dict[tuple[int, ...], float], labels: AnswerTokens, *, vocab: int,
                 capacity: int = 1 << 20, context_length: int = 4096, per_step: int = 3,
                 generations: dict[tuple[int, ...], list[int]] | None = None, eos: int = 2,
                 **server_args: object) -> None:
        unknown = sorted(set(server_args) - SERVER_ARGS)
        if unknown:
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        if "model_path" not in server_args:
            raise TypeError("Missing required argument 'model_path'")
        self.server_args = server_args
        self.margins, self.labels, self.vocab = margins, labels, vocab
        self.generations = generations if generations is not None else {}
        """What the model writes after a prompt (until its end token `eos`), for generation requests."""
        self.eos = eos
        self.capacity = int(server_args.get("max_total_tokens") or capacity)  # type: ignore[call-overload]
        self.context_length = int(server_args.get("context_length") or context_length)  # type: ignore[call-overload]
        self.per_step = per_step
        self.loop = asyncio.new_event_loop()
        self.radix: dict[int, dict] = {}
        self.waiting: deque[_Request] = deque()
        self.max_req_input_len = min(self.context_length - 1, self.capacity - 1) - 5  # as TpModelWorker sets it
        self.live_single = 0
        self.live_tokens = 0
        self.peak_single = 0
        self.peak_tokens = 0
        """Single-prompt requests (and their prompt tokens) in flight at once, and the peaks: what a
        pipelined schedule keeps live."""
        self.prompts: list[tuple[int, ...]] = []
        self.closed = False
        self._scheduler: asyncio.Task[None] | None = None

    # -- the public Engine API ------------------------------------------------------------------

    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: dict[str, object] | list[dict[str, object]] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None, *,
                 return_logprob: bool | list[bool] | None = False,
                 logprob_start_len: int | list[int] | None = None,
                 top_logprobs_num: int | list[int] | None = None,
                 token_ids_logprob: list[int] | list[list[int]] | None = None,
                 stream: bool = False, rid: str | list[str] | None = None,
                 ) -> dict[str, object] | list[dict[str, object]]:
        if stream:
            raise NotImplementedError("the fake does not stream")
        return self.loop.run_until_complete(self.async_generate(
            prompt, sampling_params, input_ids, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num, token_ids_logprob=token_ids_logprob, rid=rid))

    async def async_generate(self, prompt: str | list[str] | None = None,
                             sampling_params: dict[str, object] | list[dict[str, object]] | None = None,
                             input_ids: list[int] | list[list[int]] | None = None, *,
                             return_logprob: bool | list[bool] | None = False,
                             logprob_start_len: int | list[int] | None = None,
                             top_logprobs_num: int | list[int] | None = None,
                             token_ids_logprob: list[int] | list[list[int]] | None = None,
                             stream: bool = False, rid: str | list[str] | None = None,
                             ) -> dict[str, object] | list[dict[str, object]]:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("async_generate awaited outside Engine.loop: the tokenizer manager runs on that loop")
        if stream:
            raise NotImplementedError("the fake does not stream")
        self._check_open()
        if prompt is not None:
            raise AssertionError("the adapter sends token ids, never text")
        single, batch = _prompts(input_ids)
        requests = [self._request(i, ids, single, sampling_params, return_logprob, logprob_start_len,
                                  top_logprobs_num, token_ids_logprob, rid) for i, ids in enumerate(batch)]
        for request in requests:
            request.done = self.loop.create_future()
            request.single = single
            self.waiting.append(request)
        if single:
            self.live_single += 1
            self.live_tokens += len(requests[0].ids)
            self.peak_single = max(self.peak_single, self.live_single)
            self.peak_tokens = max(self.peak_tokens, self.live_tokens)
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = self.loop.create_task(self._schedule())
        outputs = list(await asyncio.gather(*(r.done for r in requests)))
        return outputs[0] if single else outputs

    def get_server_info(self) -> dict[str, object]:
        self._check_open()
        return {**self.server_args, "max_total_num_tokens": self.capacity, "max_req_input_len": self.max_req_input_len,
                "status": "ready", "version": "0.5.23 (fake)", "internal_states": [{}]}

    def shutdown(self) -> None:
        self.closed = True

    def flush_cache(self) -> None:
        """As `Engine.flush_cache`: the radix tree is emptied."""
        self.radix.clear()

    # -- normalisation, as GenerateReqInput / TokenizerManager do it ------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the engine was shut down")

    def _request(self, index: int, ids: list[int], single: bool, sampling: object, return_logprob: object,
                 start: object, top: object, label_ids: object, rid: object) -> _Request:
        params = _pick(sampling, index, single) or {}
        if not isinstance(params, dict):
            raise TypeError(f"sampling_params must be a dict, got {type(params).__name__}")
        _verify_sampling(params)
        if len(ids) >= self.context_length:
            raise ValueError(f"The input ({len(ids)} tokens) is longer than the model's context length "
                             f"({self.context_length} tokens).")
        if len(ids) >= self.max_req_input_len:
            raise ValueError(f"Input length ({len(ids)} tokens) exceeds the maximum allowed length "
                             f"({self.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate.")
        wanted = _pick(label_ids, index, single, nested=True)
        if wanted is not None:
            if not isinstance(wanted, list) or not all(isinstance(t, int) for t in wanted):
                raise ValueError("token_ids_logprob must be a flat list of integers.")
            if any(not 0 <= t < self.vocab for t in wanted):
                raise ValueError(f"token_ids_logprob contains out-of-vocabulary token id; valid range is "
                                 f"[0, {self.vocab}).")
        start_len = _pick(start, index, single)
        start_len = -1 if start_len is None else int(start_len)  # type: ignore[call-overload]
        if start_len > len(ids):
            raise ValueError(f"req.logprob_start_len={start_len} is higher than the number of input tokens "
                             f"len(req.origin_input_ids)={len(ids)}. Please use a smaller logprob_start_len.")
        request = _Request(_rid(rid, index, single), tuple(ids), params, start_len, wanted)
        self._check_ours(request, bool(_pick(return_logprob, index, single)), _pick(top, index, single))
        return request

    def _check_ours(self, request: _Request, return_logprob: bool, top: object) -> None:
        """What the adapter must never send, though SGLang would take it."""
        if _generating(request):
            if request.params.get("temperature") != 0 or return_logprob or request.label_ids:
                raise AssertionError(f"a greedy generation without log-probabilities expected, got {request.params}")
            return
        if request.params.get("max_new_tokens") != 1 or request.params.get("temperature") != 0:
            raise AssertionError(f"one greedy token expected, got {request.params}")
        if not return_logprob or not request.label_ids or top:
            raise AssertionError("the label log-probabilities must be asked for with token_ids_logprob alone")
        if sorted(request.label_ids) != sorted({*self.labels.true_ids, *self.labels.false_ids}):
            raise AssertionError(f"asked for label ids {request.label_ids}, expected {self.labels}")
        if 0 <= request.start < len(request.ids):
            raise AssertionError("prompt log-probabilities asked for: they cap the radix match at logprob_start_len")

    # -- the scheduler --------------------------------------------------------------------------

    async def _schedule(self) -> None:
        while self.waiting:
            await asyncio.sleep(0)  # requests submitted meanwhile join the queue, as between scheduler steps
            wave = [self.waiting.popleft() for _ in range(min(self.per_step, len(self.waiting)))]
            outputs = [self._run(request) for request in wave]
            for request in wave:
                self._insert(request.ids)
            for request, output in zip(wave, outputs, strict=True):
                self.live_single -= request.single
                self.live_tokens -= len(request.ids) * request.single
                request.done.set_result(output)

    def _run(self, request: _Request) -> dict[str, object]:
        self.prompts.append(request.ids)
        if _generating(request):
            return self._generate(request)
        margin = self.margins[request.ids]
        values = {token: OTHER_LABEL for token in request.label_ids or ()}
        best_true, best_false = self.labels.true_ids[-1], self.labels.false_ids[-1]
        values[best_true] = -1.0 + margin / 2
        values[best_false] = -1.0 - margin / 2
        chosen = best_true if margin > 0 else best_false
        meta = {
            "id": request.rid, "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": len(request.ids), "weight_version": "default", "num_retractions": 0,
            "reasoning_tokens": 0, "completion_tokens": 1, "cached_tokens": self._cached(request),
            "output_token_logprobs": [(values[chosen], chosen, None)],
            "output_token_ids_logprobs": [[(values[t], t, None) for t in request.label_ids or ()]],
        }
        output: dict[str, object] = {"output_ids": [chosen], "meta_info": meta}
        if not self.server_args.get("skip_tokenizer_init"):
            output["text"] = ""
        return output

    def _generate(self, request: _Request) -> dict[str, object]:
        """The taught continuation, cut at `max_new_tokens`, or ended by the end token — which SGLang keeps in
        `output_ids` when a stop token id matched (`finish_reason` says which)."""
        bound = int(request.params["max_new_tokens"])  # type: ignore[call-overload]
        written = list(self.generations[request.ids])
        stops = set(request.params.get("stop_token_ids") or ())  # type: ignore[call-overload]
        if self.eos not in stops:
            raise AssertionError(f"the stop token ids {sorted(stops)} leave out the model's end token {self.eos}")
        ids = written[:bound] if len(written) >= bound else [*written, self.eos]
        reason = {"type": "length", "length": bound} if len(written) >= bound else {"type": "stop",
                                                                                      "matched": self.eos}
        meta = {"id": request.rid, "finish_reason": reason, "prompt_tokens": len(request.ids),
                "completion_tokens": len(ids), "cached_tokens": self._cached(request)}
        output: dict[str, object] = {"output_ids": ids, "meta_info": meta}
        if not self.server_args.get("skip_tokenizer_init"):
            output["text"] = ""
        return output

    def _cached(self, request: _Request) -> int:
        """The longest cached prefix, capped as Req._compute_max_prefix_len caps it."""
        limit = len(request.ids) - 1
        if request.start >= 0:
            limit = min(limit, request.start)
        node, hit = self.radix, 0
        while hit < limit and request.ids[hit] in node:
            node = node[request.ids[hit]]
            hit += 1
        return hit

    def _insert(self, ids: Iterable[int]) -> None:
        node = self.radix
        for token in ids:
            node = node.setdefault(token, {})


def _prompts(input_ids: object) -> tuple[bool, list[list[int]]]:
    """(single?, the prompts): a list of ints is one request, a list of such lists a batch."""
    if input_ids is None:
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if not isinstance(input_ids, list):
        raise ValueError(f"input_ids must be list or null; got {type(input_ids).__name__}")
    if not input_ids:
        raise ValueError("input_ids cannot be empty.")
    batch = [input_ids] if isinstance(input_ids[0], int) else input_ids
    for row in batch:
        if not isinstance(row, list) or not row or not all(isinstance(t, int) for t in row):
            raise ValueError("input_ids should be a list of ints, or a list of non-empty lists of ints for a batch")
    return isinstance(input_ids[0], int), batch


def _pick(value: object, index: int, single: bool, nested: bool = False) -> object:
    """One request's value of a per-request-or-shared argument, as `_normalize_batch_inputs` spreads it."""
    if single or not isinstance(value, list):
        return value
    if nested and value and not isinstance(value[0], list):
        return value  # one flat token list, copied to every request
    return value[index]


def _rid(rid: object, index: int, single: bool) -> str:
    if rid is None:
        return uuid.uuid4().hex
    if isinstance(rid, str):
        return rid if single else f"{rid}_{index}"
    return str(rid[index])  # type: ignore[index]


def _verify_sampling(params: dict[str, object]) -> None:
    """SamplingParams(**params) then its verify(): unknown keys and out-of-range values are refused."""
    unknown = sorted(set(params) - SAMPLING_KEYS)
    if unknown:
        raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
    temperature = params.get("temperature", 1.0)
    if not isinstance(temperature, int | float) or temperature < 0:
        raise ValueError(f"temperature must be non-negative, got {temperature}.")
    new_tokens = params.get("max_new_tokens", 128)
    if new_tokens is not None and (not isinstance(new_tokens, int) or new_tokens < 0):
        raise ValueError(f"max_new_tokens must be at least 0, got {new_tokens}.")


def _generating(request: _Request) -> bool:
    """A request for more than one token or held to a schema: a generation, not a TRUE/FALSE readout."""
    return request.params.get("max_new_tokens") != 1 or "json_schema" in request.params
