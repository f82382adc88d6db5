"""The classify / score scheduler: [document][tail] per row; labels longer than one token continue from it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quail_native.executor.packing import Item, ItemResult
from quail_native.executor.state import SharedState, Tokens, drop, run_passes


@dataclass(eq=False)
class LabelDocument:
    row: int
    tokens: Tokens
    block: int | None = None
    scores: list[float] = field(default_factory=list)
    waiting: int = 0


@dataclass(frozen=True)
class LabelLayout:
    preamble: Tokens
    tail: Tokens
    labels: tuple[Tokens, ...]


LabelTag = tuple[LabelDocument, int | None]
"""A document's [doc][tail] item (None) or the continuation of one of its multi-token labels."""


def run_labels(state: SharedState, rows: Sequence[int], documents: dict[int, Tokens], layout: LabelLayout,
               first: Callable[[ItemResult], list[float]], rest: Callable[[ItemResult, Tokens], float]
               ) -> dict[int, list[float]]:
    """Per row, each label's log-probability: the first token read after [doc][tail], the rest (labels of
    two or more tokens) from a continuation over the kept [doc][tail] KV — all packed many to a pass."""
    pre = state.preamble(layout.preamble)
    start = len(layout.preamble)
    longer = [k for k, label in enumerate(layout.labels) if len(label) > 1]
    fresh = deque(LabelDocument(r, documents[r] + layout.tail) for r in rows)
    ready: deque[tuple[LabelDocument, int]] = deque()
    out: dict[int, list[float]] = {}

    def continuation(doc: LabelDocument, k: int) -> Item:
        label = layout.labels[k]
        assert doc.block is not None
        return Item(label[:-1], start + len(doc.tokens), (pre, doc.block), tuple(range(len(label) - 1)))

    def next_items(budget: int) -> list[tuple[Item, LabelTag]]:
        batch: list[tuple[Item, LabelTag]] = []
        used = 0
        while ready and used + len(layout.labels[ready[0][1]]) - 1 <= budget:
            doc, k = ready.popleft()
            batch.append((continuation(doc, k), (doc, k)))
            used += len(batch[-1][0].tokens)
        while fresh and used + len(fresh[0].tokens) <= budget:
            keep = ((0, len(fresh[0].tokens)),) if longer else ()
            pages = state.arena.pages_for(len(fresh[0].tokens)) if longer else 0
            if not state.memory.admit(pages, busy=bool(batch) or len(out) < len(rows) - len(fresh)):
                break
            doc = fresh.popleft()
            batch.append((Item(doc.tokens, start, (pre,), (len(doc.tokens) - 1,), keep), (doc, None)))
            used += len(doc.tokens)
        return batch

    def done(tag: LabelTag, result: ItemResult) -> None:
        doc, k = tag
        if k is None:
            doc.scores = first(result)
            doc.block = result.blocks[0] if result.blocks else None
            doc.waiting = len(longer)
            ready.extend((doc, j) for j in longer)
        else:
            doc.scores[k] += rest(result, layout.labels[k])
            doc.waiting -= 1
        if doc.waiting == 0:
            drop(state, doc.block)
            out[doc.row] = doc.scores

    run_passes(state, next_items, done, lambda: state.report(len(out), len(rows)))
    return out
