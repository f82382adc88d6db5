"""Cross-document prefix sharing: which document lends its leading KV pages to which.

Documents that start with the same tokens (cumulative agent traces, templated records) have the
same KV over that prefix. Sorted by tokens, documents with long common prefixes are neighbours, so
a document can borrow its common prefix from a neighbour computed before it and compute only its
tail — nothing of itself when it is a prefix of its lender (a cumulative trace's earlier step): its
first item is then its frame and question alone. Borrowing is token-granular
(the arena shares the lender's whole pages and copies the part-page), but only a prefix of at
least one page is worth it: shorter ones would cost a wait and an attention segment of their own
to save a few tokens.

Lenders are computed before borrowers: documents go longest first, so a cumulative trace's last
step lends to every earlier step (one level deep instead of a chain), and among equally good
lenders the one with the fewest lenders above it wins, which keeps the waiting short.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Tokens = Sequence[int]
NEIGHBOURS = 32
"""How far along the sorted order a document looks for a lender (bounds planning to O(n·32))."""


@dataclass(frozen=True)
class Borrow:
    """`row` computes only its tokens from `tokens` on, over the first `tokens` of `lender`'s KV."""

    row: int
    lender: int
    tokens: int


def common_prefix(a: Tokens, b: Tokens) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def borrowable(common: int, length: int, page_tokens: int) -> int:
    """Tokens of a common prefix a document borrows: all of it (the whole document when it is a prefix of
    its lender), when that is at least a page (0 otherwise)."""
    tokens = min(common, length)
    return tokens if tokens >= page_tokens else 0


def shareable_tokens(documents: Sequence[Tokens], page_tokens: int) -> int:
    """Σ over sorted documents of the prefix each can borrow from its predecessor: the work saved."""
    ordered = sorted(tuple(d) for d in documents)
    return sum(borrowable(common_prefix(previous, current), len(current), page_tokens)
               for previous, current in itertools.pairwise(ordered))


def plan_borrows(documents: Mapping[int, Tokens], page_tokens: int) -> tuple[list[int], dict[int, Borrow]]:
    """(rows in computation order — lenders before borrowers —, each borrowing row's Borrow)."""
    ordered = sorted(documents, key=lambda r: tuple(documents[r]))
    adjacent = [common_prefix(documents[a], documents[b]) for a, b in itertools.pairwise(ordered)]
    rank = {row: i for i, row in enumerate(sorted(ordered, key=lambda r: (-len(documents[r]), tuple(documents[r]))))}
    index = {row: i for i, row in enumerate(ordered)}
    depth: dict[int, int] = {}
    borrows: dict[int, Borrow] = {}
    for row in sorted(rank, key=rank.__getitem__):
        best = _best_lender(row, ordered, adjacent, index[row], rank, depth, len(documents[row]), page_tokens)
        depth[row] = 0 if best is None else depth[best.lender] + 1
        if best is not None:
            borrows[row] = best
    computation = sorted(rank, key=lambda r: (depth[r], rank[r]))
    return computation, borrows


def _best_lender(row: int, ordered: list[int], adjacent: list[int], at: int, rank: Mapping[int, int],
                 depth: Mapping[int, int], length: int, page_tokens: int) -> Borrow | None:
    best: tuple[int, int, int] | None = None  # (tokens, -depth, -rank) of the best lender so far
    lender = -1
    for step in (-1, 1):
        common = length
        j = at
        for _ in range(NEIGHBOURS):
            j += step
            if not 0 <= j < len(ordered):
                break
            common = min(common, adjacent[min(j, j - step)])
            tokens = borrowable(common, length, page_tokens)
            if tokens == 0:
                break
            other = ordered[j]
            if rank[other] > rank[row]:
                continue
            key = (tokens, -depth[other], -rank[other])
            if best is None or key > best:
                best, lender = key, other
    return None if best is None else Borrow(row, lender, best[0])
