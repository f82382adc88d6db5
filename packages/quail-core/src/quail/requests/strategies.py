"""The submission schedules of the request backends, written against the `RequestEngine` role.

Filters: operator-at-a-time (one batch per stage) or pipelined (a document's next stage is
submitted the moment it answers TRUE; live documents capped by the KV capacity, so the engine
never evicts a document's prefix before its last stage). Joins: anchor-major (every partner of an
anchor, then the next anchor) or suffix-major (one partner of every anchor per wave, so each anchor
prefix is computed once in the first wave and read from the prefix cache after — only when every
anchor prefix fits the cache at once). Verdicts always come back in anchor-major order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Literal

from quail.data.tokenizer import TokenIds
from quail.prompts import AnswerTokens
from quail.requests.engine import EngineAnswer, EngineRequest, RequestEngine

FilterStrategy = Literal["operator", "pipelined"]
"""operator: one batch per stage over every live document; pipelined: a document's next stage is
submitted as soon as it answers TRUE, with live documents capped by the engine's KV capacity."""

JoinStrategy = Literal["anchor_major", "suffix_major", "fit"]
"""anchor_major: every partner of an anchor, then the next anchor; suffix_major: one partner of
every anchor per wave; fit: suffix_major when every anchor prefix fits the KV cache at once."""


@dataclass(frozen=True)
class RequestStrategy:
    """How the engine is fed: the filter and join schedules."""

    filters: FilterStrategy = "pipelined"
    joins: JoinStrategy = "fit"

    def __post_init__(self) -> None:
        if self.filters not in ("operator", "pipelined"):
            raise ValueError(f"filter strategy must be 'operator' or 'pipelined', got {self.filters!r}")
        if self.joins not in ("anchor_major", "suffix_major", "fit"):
            raise ValueError(f"join strategy must be 'anchor_major', 'suffix_major' or 'fit', got {self.joins!r}")

Rows = tuple[int, ...]
"""The rows an answer is about: (row,) for a filter, one row per alias for a join."""


@dataclass(frozen=True)
class Verdict:
    """One answered request: which rows, which stage, TRUE or FALSE, and the margin it came from."""

    rows: Rows
    stage: int
    answer: bool
    margin: float


@dataclass
class Tally:
    """Prompt and cached tokens over every answer a node received (the report's fresh / cached)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0

    def add(self, answer: EngineAnswer) -> None:
        self.prompt_tokens += answer.prompt_tokens
        self.cached_tokens += answer.cached_tokens
        self.requests += 1

    @property
    def fresh_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


# -- filters ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterWork:
    """Stages over documents: `prompt(row, stage)` is the full token prompt, `holds(stage, margin)` its answer."""

    rows: Sequence[int]
    stages: int
    prompt: Callable[[int, int], TokenIds]
    holds: Callable[[int, float], bool]
    labels: AnswerTokens


def run_filter(engine: RequestEngine, strategy: FilterStrategy, work: FilterWork, tally: Tally) -> list[Verdict]:
    """Every stage a document reaches (it stops at its first FALSE), sorted by row then stage."""
    if strategy == "operator":
        verdicts = _filter_by_stage(engine, work, tally)
    else:
        verdicts = _filter_pipelined(engine, work, tally)
    return sorted(verdicts, key=lambda v: (v.rows, v.stage))


def _filter_by_stage(engine: RequestEngine, work: FilterWork, tally: Tally) -> list[Verdict]:
    live = list(work.rows)
    verdicts: list[Verdict] = []
    for stage in range(work.stages):
        requests = [EngineRequest(i, work.prompt(row, stage), work.labels) for i, row in enumerate(live)]
        answers = _by_key(engine.generate(requests))
        survivors = []
        for i, row in enumerate(live):
            answer = answers[i]
            tally.add(answer)
            holds = work.holds(stage, answer.margin)
            verdicts.append(Verdict((row,), stage, holds, answer.margin))
            if holds:
                survivors.append(row)
        live = survivors
    return verdicts


def _filter_pipelined(engine: RequestEngine, work: FilterWork, tally: Tally) -> list[Verdict]:
    longest = max((len(work.prompt(row, s)) for row in work.rows for s in range(work.stages)), default=1)
    cap = live_cap(engine, longest)
    waiting = deque(work.rows)
    flight = _Flight(engine, work.labels)
    verdicts: list[Verdict] = []
    while waiting or flight.pending:
        while waiting and len(flight.pending) < cap:
            row = waiting.popleft()
            flight.send((row,), 0, work.prompt(row, 0))
        for (rows, stage), answer in flight.receive():
            tally.add(answer)
            holds = work.holds(stage, answer.margin)
            verdicts.append(Verdict(rows, stage, holds, answer.margin))
            if holds and stage + 1 < work.stages:  # the survivor takes its own slot: admitted before new documents
                flight.send(rows, stage + 1, work.prompt(rows[0], stage + 1))
    return verdicts


def live_cap(engine: RequestEngine, longest_prompt: int) -> int:
    """How many prompts of the longest length the KV cache holds at once (at least one)."""
    return max(1, engine.kv_capacity_tokens() // max(1, longest_prompt))


@dataclass
class _Flight:
    """Requests submitted and not yet answered, keyed by the engine's request key."""

    engine: RequestEngine
    labels: AnswerTokens
    pending: dict[int, tuple[Rows, int]] = field(default_factory=dict)
    keys: count = field(default_factory=count)

    def send(self, rows: Rows, stage: int, tokens: TokenIds) -> None:
        key = next(self.keys)
        self.pending[key] = (rows, stage)
        self.engine.submit(EngineRequest(key, tokens, self.labels))

    def receive(self) -> list[tuple[tuple[Rows, int], EngineAnswer]]:
        return [(self.pending.pop(answer.key), answer) for answer in self.engine.step()]


# -- joins --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnchorWork:
    """One anchor: its prefix (preamble + document + frame) and, per candidate tuple, the suffix."""

    row: int
    prefix: TokenIds
    tuples: tuple[tuple[Rows, TokenIds], ...]


@dataclass(frozen=True)
class JoinWork:
    anchors: Sequence[AnchorWork]
    stop_at_true: bool
    holds: Callable[[float], bool]
    labels: AnswerTokens


def join_order(engine: RequestEngine, strategy: JoinStrategy, work: JoinWork) -> JoinStrategy:
    """The fit check: suffix-major only when every anchor prefix (and its longest suffix) fits at once."""
    if strategy != "fit":
        return strategy
    needed = sum(len(a.prefix) + max((len(s) for _, s in a.tuples), default=0) for a in work.anchors)
    return "suffix_major" if needed <= engine.kv_capacity_tokens() else "anchor_major"


def run_join(engine: RequestEngine, strategy: JoinStrategy, work: JoinWork, tally: Tally) -> list[Verdict]:
    """Answers for the candidate tuples, in anchor-major order; exists / anti joins may stop an anchor at TRUE."""
    order = join_order(engine, strategy, work)
    verdicts = _suffix_major(engine, work, tally) if order == "suffix_major" else _anchor_major(engine, work, tally)
    rank = {rows: (i, j) for i, a in enumerate(work.anchors) for j, (rows, _) in enumerate(a.tuples)}
    return sorted(verdicts, key=lambda v: rank[v.rows])


def _anchor_major(engine: RequestEngine, work: JoinWork, tally: Tally) -> list[Verdict]:
    """Every tuple in one batch, anchor by anchor: the engine's prefix cache shares each anchor's prefix."""
    requests, items = [], []
    for anchor in work.anchors:
        for rows, suffix in anchor.tuples:
            requests.append(EngineRequest(len(items), anchor.prefix + suffix, work.labels))
            items.append(rows)
    answers = _by_key(engine.generate(requests))
    verdicts = []
    for key, rows in enumerate(items):
        tally.add(answers[key])
        verdicts.append(Verdict(rows, 0, work.holds(answers[key].margin), answers[key].margin))
    return verdicts


def _suffix_major(engine: RequestEngine, work: JoinWork, tally: Tally) -> list[Verdict]:
    """Wave j asks the j-th tuple of every anchor still open; an exists / anti anchor closes at its first TRUE."""
    verdicts: list[Verdict] = []
    open_anchors = [a for a in work.anchors if a.tuples]
    wave = 0
    while open_anchors:
        asked = [a for a in open_anchors if wave < len(a.tuples)]
        answers = _by_key(engine.generate([EngineRequest(i, a.prefix + a.tuples[wave][1], work.labels)
                                           for i, a in enumerate(asked)]))
        still_open = []
        for i, anchor in enumerate(asked):
            answer = answers[i]
            tally.add(answer)
            holds = work.holds(answer.margin)
            verdicts.append(Verdict(anchor.tuples[wave][0], 0, holds, answer.margin))
            if not (holds and work.stop_at_true) and wave + 1 < len(anchor.tuples):
                still_open.append(anchor)
        open_anchors = still_open
        wave += 1
    return verdicts


def _by_key(answers: Sequence[EngineAnswer]) -> dict[int, EngineAnswer]:
    return {answer.key: answer for answer in answers}
