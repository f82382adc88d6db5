"""The cost model: work counts per primitive, priced by a roofline from ModelSpec and DeviceSpec.

No fitted constants. A forward pass computes fresh tokens through the dense layers (2·params
FLOPs per token, weights re-read once per pass), attends (4·heads·head_dim FLOPs per layer and
query-key pair) and reads / writes KV (κ bytes per token). Each component costs
max(FLOPs / peak, bytes / bandwidth); components add up.

Primitives over documents summarised by (count, Σlen, Σlen²):
* scan(P, S): compute P + S fresh tokens from nothing, write their KV;
* ask(P, S): S fresh tokens attending to a resident prefix of P tokens, read P KV rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from quail.catalog.devices import DeviceSpec, Precision
from quail.catalog.models import ModelSpec


@dataclass(frozen=True)
class Lengths:
    """A set of sequences by count, Σlen and Σlen²: enough to price any stage in O(1)."""

    count: float
    total: float
    squares: float
    maximum: float = 0.0

    @classmethod
    def of(cls, lengths: list[int] | tuple[int, ...]) -> Lengths:
        return cls(float(len(lengths)), float(sum(lengths)), float(sum(n * n for n in lengths)),
                   float(max(lengths, default=0)))

    def scaled(self, fraction: float) -> Lengths:
        """The expected summary of a random `fraction` of the sequences."""
        return Lengths(self.count * fraction, self.total * fraction, self.squares * fraction, self.maximum)

    def plus(self, constant: float) -> Lengths:
        """Every sequence longer by `constant` tokens."""
        return Lengths(self.count, self.total + constant * self.count,
                       self.squares + 2 * constant * self.total + constant * constant * self.count,
                       self.maximum + constant)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    @property
    def mean_square(self) -> float:
        return self.squares / self.count if self.count else 0.0


@dataclass(frozen=True)
class Work:
    """What a stage asks of the model; every field is additive and linear in the number of items.

    `answers` are rows read through a handful of head columns (TRUE/FALSE); `vocabulary_rows` need the
    whole head (label log-probabilities).
    """

    tokens: float = 0.0
    pairs: float = 0.0
    kv_read: float = 0.0
    kv_written: float = 0.0
    answers: float = 0.0
    vocabulary_rows: float = 0.0
    steps: float = 0.0
    """Forward passes beyond those the tokens fill: decoding computes one token per sequence per pass, and every
    pass reads the weights once, however few its tokens."""

    def __add__(self, other: Work) -> Work:
        return Work(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def times(self, factor: float) -> Work:
        return Work(*(getattr(self, f.name) * factor for f in fields(self)))


NOTHING = Work()

ANSWER_COLUMNS = 8
"""Head columns a TRUE/FALSE readout computes (the TRUE-like and FALSE-like first tokens)."""


def triangle(lengths: Lengths) -> float:
    """Σ T(n) with T(n) = n(n+1)/2: causal attention pairs of sequences computed from scratch."""
    return (lengths.squares + lengths.total) / 2


def scan(sequences: Lengths, answers: bool = True) -> Work:
    """Compute each sequence from nothing (its whole KV is written)."""
    return Work(tokens=sequences.total, pairs=triangle(sequences), kv_written=sequences.total,
                answers=sequences.count if answers else 0.0)


def ask(prefixes: Lengths, questions: Lengths, answers: bool = True) -> Work:
    """Each question (one per prefix, paired in order) attends to its resident prefix.

    Σ S·P over pairs uses the product of means: prefixes and questions are independent.
    """
    count = questions.count
    cross = count * prefixes.mean * questions.mean
    return Work(tokens=questions.total, pairs=cross + triangle(questions), kv_read=count * prefixes.mean,
                kv_written=questions.total, answers=count if answers else 0.0)


def decode(sequences: int, tokens: int, prompts: Lengths, batch: int) -> Work:
    """Greedy decoding of `tokens` tokens after each of `sequences` prompts, `batch` sequences a pass: each token
    attends to its prompt and the tokens before it, and is read through the whole head (the next token is the
    vocabulary's argmax)."""
    written = float(sequences * tokens)
    pairs = sequences * (tokens * prompts.mean + tokens * (tokens + 1) / 2)
    steps = math.ceil(sequences / max(batch, 1)) * tokens
    return Work(tokens=written, pairs=pairs, kv_read=pairs, kv_written=written, vocabulary_rows=written,
                steps=float(steps))


def stream(prefixes: Lengths, questions: list[Lengths]) -> Work:
    """Several asks over one set of prefixes."""
    total = NOTHING
    for question in questions:
        total = total + ask(prefixes, question)
    return total


def precision_of(model: ModelSpec) -> Precision:
    if model.weight_bytes <= 1:
        return "fp8"
    return "bf16" if model.weight_bytes <= 2 else "fp32"


@dataclass(frozen=True)
class CostModel:
    """Seconds of work on one device; `chunk_tokens` sets how often weights are re-read."""

    model: ModelSpec
    device: DeviceSpec
    chunk_tokens: int

    @property
    def peak(self) -> float:
        return self.device.peak_flops(precision_of(self.model))

    def seconds(self, work: Work) -> float:
        model, bandwidth = self.model, self.device.bandwidth_bytes_per_s
        passes = work.tokens / self.chunk_tokens + work.steps
        dense_flops = 2 * model.non_embedding_params * work.tokens + self.head_flops(work)
        dense_bytes = model.non_embedding_params * model.weight_bytes * passes
        dense = max(dense_flops / self.peak, dense_bytes / bandwidth)
        attention_flops = 4 * model.heads * model.head_dim * model.layers * work.pairs
        kv_bytes = model.kv_bytes_per_token * (work.kv_read + work.kv_written)
        attention = max(attention_flops / self.peak, kv_bytes / bandwidth)
        return dense + attention

    def flops(self, work: Work) -> float:
        """Model FLOPs of the work: the numerator of achieved-FLOP/s efficiency."""
        model = self.model
        return (2 * model.non_embedding_params * work.tokens + self.head_flops(work)
                + 4 * model.heads * model.head_dim * model.layers * work.pairs)

    def head_flops(self, work: Work) -> float:
        model = self.model
        return 2 * model.hidden * (ANSWER_COLUMNS * work.answers + model.vocab * work.vocabulary_rows)
