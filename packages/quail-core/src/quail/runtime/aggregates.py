"""Answering AI aggregates (`quail.frontend.aggregates`): each distinct group's texts reduced to one answer.

A group's texts are packed, in order, into documents that fit one prompt beside the instruction and the answer's
token bound; each document is answered by a generation (an ordinary AI_COMPLETE query over a relation of the
documents, so it is planned, batched and stored like any other). A group that needed one document has its answer;
one that needed several has their answers as its new texts, combined the same way in the next round — so a
group of any size is answered, in rounds whose documents shrink to the bound each time. All groups advance
together: one query per round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from sqlglot import exp

from quail.data.tokenizer import Tokenizer
from quail.errors import Refusal, RefusalError
from quail.runtime.results import QueryResult

SEPARATOR = "\n\n---\n\n"
TEMPLATE = "{instruction} The texts are in {{0}}, one after another, separated by lines of dashes."
COMBINE = ("Each part of {{0}} answers this instruction over a share of the texts: {instruction} Combine them into "
           "one answer to it.")
OVERHEAD = 64
"""Tokens kept, beyond the instruction's own, for the layout's text around a document (its labels, a chat turn's
markers, the answer cue)."""
MAX_ROUNDS = 16
AGGREGATE_MAX_TOKENS = 256
"""The bound of an aggregate's answer (and of each partial answer): Snowflake's functions take none."""

RunGenerations = Callable[[exp.Select, pa.Table], QueryResult]
"""Runs one round: the AI_COMPLETE query over the round's documents (columns id and doc), with them registered
under the relation it reads."""


@dataclass
class Reduction:
    """What reducing one aggregate's groups did: its answers by group, and every round's query result."""

    answers: list[str | None]
    results: list[QueryResult]


def reduce_groups(groups: Sequence[Sequence[str] | None], instruction: str, tokenizer: Tokenizer, prompt_tokens: int,
                  run: RunGenerations, relation: str) -> Reduction:
    """Each group's answer (None for a group without texts), in as many rounds as its largest group needs."""
    budget = _budget(COMBINE, instruction, tokenizer, prompt_tokens)
    if budget < 2 * AGGREGATE_MAX_TOKENS:
        raise RefusalError(Refusal(
            "an AI aggregate's documents leave no room to combine two partial answers in one prompt",
            (f"a prompt holds {prompt_tokens:,} tokens; the answer's bound is {AGGREGATE_MAX_TOKENS}",),
            needed=2 * AGGREGATE_MAX_TOKENS + AGGREGATE_MAX_TOKENS + OVERHEAD, available=prompt_tokens,
            unit="tokens", hints=("raise EngineConfig.chunk_tokens",)))
    answers: list[str | None] = [None] * len(groups)
    pending = {g: list(texts) for g, texts in enumerate(groups) if texts}
    results: list[QueryResult] = []
    template = TEMPLATE
    for _ in range(MAX_ROUNDS):
        if not pending:
            return Reduction(answers, results)
        room = _budget(template, instruction, tokenizer, prompt_tokens)
        documents = [(g, document) for g, texts in pending.items() for document in pack(texts, tokenizer, room)]
        table = pa.table({"id": list(range(len(documents))), "doc": [d for _, d in documents]})
        result = run(_query(template.format(instruction=instruction), relation), table)
        results.append(result)
        written = dict(zip(result.collect().column("id").to_pylist(), result.collect().column("v").to_pylist(),
                           strict=True))
        parts: dict[int, list[str]] = {}
        for index, (group, _) in enumerate(documents):
            parts.setdefault(group, []).append(written[index] or "")
        pending = {}
        for group, outputs in parts.items():
            if len(outputs) == 1:
                answers[group] = outputs[0]
            else:
                pending[group] = outputs
        template = COMBINE
    raise RuntimeError(f"an AI aggregate did not reduce to one answer in {MAX_ROUNDS} rounds")


def _budget(template: str, instruction: str, tokenizer: Tokenizer, prompt_tokens: int) -> int:
    """Tokens a round's document may take: the prompt, less the answer's bound, the instruction and the layout."""
    own = len(tokenizer.encode(template.format(instruction=instruction)))
    return prompt_tokens - AGGREGATE_MAX_TOKENS - own - OVERHEAD


def pack(texts: Sequence[str], tokenizer: Tokenizer, budget: int) -> list[str]:
    """The texts, in order, as documents of at most `budget` tokens each (a longer text is cut into pieces)."""
    documents: list[str] = []
    current: list[str] = []
    used = 0
    separator = len(tokenizer.encode(SEPARATOR))
    for text in texts:
        for piece in _pieces(text, tokenizer, budget):
            size = len(tokenizer.encode(piece)) + separator
            if current and used + size > budget:
                documents.append(SEPARATOR.join(current))
                current, used = [], 0
            current.append(piece)
            used += size
    if current:
        documents.append(SEPARATOR.join(current))
    return documents


def _pieces(text: str, tokenizer: Tokenizer, budget: int) -> list[str]:
    ids = tokenizer.encode(text)
    if len(ids) <= budget - 8:
        return [text]
    step = max(budget - 8, 1)
    return [tokenizer.decode(ids[start:start + step]) for start in range(0, len(ids), step)]


def _query(template: str, relation: str) -> exp.Select:
    prompt = exp.Anonymous(this="PROMPT", expressions=[exp.Literal.string(template), exp.column("doc", table="d")])
    bound = exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier("max_tokens"),
                                                   expression=exp.Literal.number(AGGREGATE_MAX_TOKENS))])
    call = exp.Anonymous(this="AI_COMPLETE", expressions=[prompt, bound])
    documents = exp.Subquery(this=exp.select("id", "doc").from_(exp.to_table(relation)), alias=exp.TableAlias(
        this=exp.to_identifier("d")))  # a derived table: the documents are a relation of this run, not a table
    return exp.select(exp.column("id", table="d"), exp.alias_(call, "v")).from_(documents)
