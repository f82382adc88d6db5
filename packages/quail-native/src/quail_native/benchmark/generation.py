"""`quail bench --generation`: decoding measured against its own limit and beside the alternatives, in one run.

* Decode rate: AI_COMPLETE over 1 and over `batch` documents, each run with a 1-token bound (the prefill alone)
  and with `tokens` more: the difference is decoding. Batch-1's rate is set beside the weight-bandwidth limit —
  every decode step reads the model's weights (and the head, for the next token's argmax) once, so tokens/s cannot
  pass (memory bandwidth measured here) ÷ (bytes read per step) — and the batched rate beside batch-1's.
* Extract: AI_EXTRACT over the reviews on each backend, beside a naive loop — transformers' `generate` on each
  document's prompt ids in turn, asked for as many tokens as the native decoder wrote for it (the same work).
* Aggregate: AI_AGG per star rating on each backend.
Printed as ratios and written to generation.md in --out. The answer store is off: every run computes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import quail
from quail.extend import datasets

GENERATE = ("SELECT r.id, AI_COMPLETE(PROMPT('Retell the review {{0}} in your own words, at length.', r.body), "
            "{{'max_tokens': {tokens}}}) AS g FROM reviews r WHERE r.id <= {documents}")
EXTRACT = ("SELECT r.id, AI_EXTRACT(r.body, {{'praised': 'What does the critic praise?', 'actor': 'Which actor is "
           "named?'}}) AS x FROM reviews r WHERE r.id <= {documents}")
AGGREGATE = ("SELECT r.stars, AI_AGG(r.body, 'What do these critics agree on? One sentence.') AS a FROM reviews r "
             "WHERE r.id <= {documents} GROUP BY r.stars")


@dataclass(frozen=True)
class Timed:
    seconds: float
    result: quail.QueryResult


def memory_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second this machine reads from memory: the best of `repeats` sums over a buffer far larger than
    any cache."""
    buffer = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        float(buffer.sum())
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best


def weight_bytes_per_step(model: quail.ModelSpec, bytes_per_weight: float) -> float:
    """What one decode step reads: every layer's weights and the whole head (the argmax needs every logit)."""
    return (model.non_embedding_params + model.vocab * model.hidden) * bytes_per_weight


def timed(session: quail.Session, sql: str) -> Timed:
    query = session.sql(sql)
    query.plan()  # tokenizing and planning are not what is measured
    started = time.perf_counter()
    result = query.run()
    return Timed(time.perf_counter() - started, result)


def generated_tokens(result: quail.QueryResult) -> list[int]:
    return [len(tokens) for name, table in result.answer_tables.items() if name.startswith("generate_")
            for tokens in table.column("tokens").to_pylist()]


@dataclass(frozen=True)
class Rate:
    sequences: int
    tokens: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def decode_rate(session: quail.Session, documents: int, tokens: int) -> Rate:
    """Tokens decoded per second over `documents` sequences: the run with the bound less the prefill-only run."""
    timed(session, GENERATE.format(tokens=1, documents=documents))  # warm: the engine is booted
    prefill = timed(session, GENERATE.format(tokens=1, documents=documents))
    whole = timed(session, GENERATE.format(tokens=tokens + 1, documents=documents))
    written = sum(max(n - 1, 0) for n in generated_tokens(whole.result))
    return Rate(documents, written, max(whole.seconds - prefill.seconds, 1e-9))


BANDWIDTH_PAIRS = 3
"""Batch-1 measurements, each right after its own bandwidth probe: a shared machine's memory bandwidth moved
between 45 and 85 GB/s from one second to the next here, so a probe taken once, before everything, said little
about the bandwidth a decode run seconds later had."""


@dataclass(frozen=True)
class PairedDecode:
    """One batch-1 decode measurement, the bandwidth probed just before it, and its rate over that limit."""

    bandwidth: float
    rate: Rate
    ratio: float


def paired_decode(session: quail.Session, tokens: int, step_bytes: float) -> PairedDecode:
    """Batch-1 decoding beside the weight-bandwidth limit of the bandwidth probed just before it."""
    bandwidth = memory_bandwidth()
    rate = decode_rate(session, 1, tokens)
    return PairedDecode(bandwidth, rate, rate.per_second / (bandwidth / step_bytes))


def naive_loop(directory: Path, prompts: Sequence[tuple[int, ...]], lengths: Sequence[int]) -> float:
    """transformers' greedy `generate` on each prompt in turn, `lengths[i]` new tokens each (fp32, eager)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    started = time.perf_counter()
    with torch.inference_mode():
        for prompt, length in zip(prompts, lengths, strict=True):
            ids = torch.tensor([list(prompt)])
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max(length, 1),
                           min_new_tokens=max(length, 1), do_sample=False, pad_token_id=0)
    return time.perf_counter() - started


def session_on(model: str, precision: str, backend: str, chunk_tokens: int) -> quail.Session:
    config = quail.EngineConfig(model=model, precision=precision, cache="off",  # type: ignore[arg-type]
                                backend=backend, chunk_tokens=chunk_tokens)
    opened = quail.Session(config)
    opened.register("reviews", datasets.reviews())
    return opened


def run_generation(model: str, precision: str, out: Path, backends: Sequence[str] = ("native",),
                   documents: int = 32, tokens: int = 48, chunk_tokens: int = 2048) -> int:
    from quail_native.models.locate import model_directory
    from quail_native.precision import choose_precision

    spec = quail.ExtensionRegistry.with_built_ins().model(model)
    chosen = choose_precision(precision, torch.device("cpu"), spec.hidden, spec.ffn)
    bytes_per_weight = 4.0 if chosen.dtype == torch.float32 else 2.0
    lines: list[str] = []
    extract: dict[str, Timed] = {}
    with session_on(model, precision, "native", chunk_tokens) as session:
        step = weight_bytes_per_step(spec, bytes_per_weight)
        paired = sorted((paired_decode(session, tokens, step) for _ in range(BANDWIDTH_PAIRS)),
                        key=lambda pair: pair.ratio)
        middle = paired[len(paired) // 2]
        single, bandwidth, limit = middle.rate, middle.bandwidth, middle.bandwidth / step
        lines.append(f"decode, 1 sequence: {single.per_second:.2f} tokens/s; weight-bandwidth limit {limit:.2f} "
                     f"tokens/s ({bandwidth / 1e9:.1f} GB/s measured just before, {step / 1e6:.0f} MB a step in "
                     f"{chosen.dtype}); measured / limit {middle.ratio:.2f} (the median of {len(paired)} such pairs: "
                     + ", ".join(f"{pair.ratio:.2f} at {pair.bandwidth / 1e9:.0f} GB/s" for pair in paired) + ")")
        batched = decode_rate(session, documents, tokens)
        lines.append(f"decode, {documents} sequences: {batched.per_second:.2f} tokens/s "
                     f"({batched.per_second / max(single.per_second, 1e-9):.1f}× one sequence)")
        extract["native"] = timed(session, EXTRACT.format(documents=documents))
        aggregate = timed(session, AGGREGATE.format(documents=documents))
        lines.append(f"aggregate, AI_AGG per star rating over {documents} reviews on native: "
                     f"{aggregate.seconds:.1f} s")
        node = next(n for n in extract["native"].result.answer_tables if n.startswith("generate_"))
        answers = extract["native"].result.answer_tables[node]
        plan = session.sql(EXTRACT.format(documents=documents)).plan().graph.node(node)
        texts = session.tokenizer.encode_batch(datasets.reviews().column("body").to_pylist())
        prompts = [plan.document_prompt(tuple(texts[row])) for row in answers.column("r").to_pylist()]
        lengths = [len(t) for t in answers.column("tokens").to_pylist()]
    for backend in backends:
        if backend == "native":
            continue
        with session_on(model, precision, backend, chunk_tokens) as other:
            timed(other, EXTRACT.format(documents=1))  # boot
            extract[backend] = timed(other, EXTRACT.format(documents=documents))
    naive = naive_loop(model_directory(spec), prompts, lengths)
    report = extract["native"].result.report
    fresh, minimum = report["fresh_tokens"], report["minimum_tokens"]
    ratio = f"{fresh / minimum:.3f}" if isinstance(fresh, int) and isinstance(minimum, int) and minimum else "?"
    lines.append(f"extract, AI_EXTRACT over {documents} reviews: native {extract['native'].seconds:.1f} s, "
                 f"naive transformers loop {naive:.1f} s ({naive / extract['native'].seconds:.1f}× slower, "
                 f"{sum(lengths):,} tokens written), fresh / minimum prefill tokens {ratio}")
    for backend, run in extract.items():
        if backend != "native":
            lines.append(f"extract on {backend}: {run.seconds:.1f} s ({run.seconds / extract['native'].seconds:.2f}× "
                         "native's wall)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "generation.md").write_text("\n".join([f"# Generation ({model}, {chosen.dtype}), one run", "",
                                                  *(f"* {line}" for line in lines), ""]))
    for line in lines:
        print(line)
    return 0

