"""Prefix sharing inside a scheduler: which document borrows from which, and the views in between.

A document borrows the common prefix it shares with a lender computed before it
(`quail.planner.prefixes.plan_borrows`): once the lender's document KV exists, the borrower gets a
view of its pages (`KVArena.view`, token-granular) and computes only its own tail; its first item
then continues the view into its own block (`KVArena.concat`). A borrower can also ride in the
lender's own pass (`riders`): its item continues the lender's item there (`Item.lender`) and gets
its view once the pass has kept the lender's block — no pass of borrowers after the lenders'.
While a borrower waits to be admitted its view is evictable — if admission needs the pages, the
borrower computes its whole document instead (counted as recomputed tokens). The filter and join
schedulers both lend this way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from quail.extend import plan_borrows
from quail_native.executor.packing import Item
from quail_native.executor.state import SharedState, Tokens


@dataclass(eq=False)
class Loan:
    """A document's part in prefix sharing."""

    borrowed: int = 0
    """Tokens of its lender's document it reads instead of computing (0: it borrows nothing)."""
    view: int | None = None
    """The lender's pages over those tokens, from the moment they are lent until its first item runs."""
    borrowers: list[Lendable] = field(default_factory=list)
    """Documents waiting for this one's KV."""
    riding: Item | None = None
    """The lender's item when this borrower computes in the same pass (`Lending.riders`), until its view exists."""


class Lendable(Protocol):
    @property
    def tokens(self) -> Tokens: ...

    @property
    def loan(self) -> Loan: ...


D = TypeVar("D", bound=Lendable)


@dataclass
class Lending(Generic[D]):
    state: SharedState
    lent: deque[D] = field(default_factory=deque)
    """Borrowers whose views are ready: admitted before documents that start from nothing."""

    def plan(self, documents: Mapping[int, D]) -> list[D]:
        """The documents that borrow nothing, lenders before the rest; each borrower waits on its lender."""
        order, borrows = plan_borrows({row: doc.tokens for row, doc in documents.items()},
                                      self.state.arena.page_tokens)
        free = []
        for row in order:
            borrow = borrows.get(row)
            if borrow is None:
                free.append(documents[row])
            else:
                documents[row].loan.borrowed = borrow.tokens
                documents[borrow.lender].loan.borrowers.append(documents[row])
        return free

    @staticmethod
    def skipped(doc: D) -> int:
        """Leading tokens of `doc` its first item does not compute (read through its view, or in the pass
        from its lender's rows)."""
        return doc.loan.borrowed if doc.loan.view is not None or doc.loan.riding is not None else 0

    def riders(self, lender: D, item: Item) -> list[D]:
        """The borrowers of `lender` not yet admitted that could compute in the pass where `item` computes
        the lender's document: only when the lender borrowed nothing itself, so that its item starts at the
        document's first token over the preamble alone — the parents a rider's item has too."""
        if self.skipped(lender):
            return []
        return [b for b in lender.loan.borrowers
                if b.loan.riding is None and item.tokens[:b.loan.borrowed] == b.tokens[:b.loan.borrowed]]

    def admit_riders(self, lender: D, item: Item, admit: Callable[[D], bool]) -> None:
        """Offer the scheduler each rider of `lender` (`riders`), marked as computing in the pass of `item`:
        `admit` puts its item in the pass behind the lender's when it fits and says whether it did. The first
        that does not fit is unmarked and ends the round; the rest wait for the lender's KV."""
        for rider in self.riders(lender, item):
            rider.loan.riding = item
            if not admit(rider):
                rider.loan.riding = None
                return

    @staticmethod
    def release(lender: D, borrower: D) -> None:
        """`borrower` found its whole document elsewhere (kept by a filter): it borrows nothing after all."""
        lender.loan.borrowers.remove(borrower)
        borrower.loan.borrowed = 0
        borrower.loan.riding = None

    @staticmethod
    def in_pass(doc: D) -> tuple[Item | None, int]:
        """`Item.lender` and `Item.lent` of a document's first item: a rider continues its lender's item."""
        riding = doc.loan.riding
        return (None, 0) if riding is None else (riding, doc.loan.borrowed)

    @staticmethod
    def parents(doc: D) -> tuple[int, ...]:
        return (doc.loan.view,) if doc.loan.view is not None else ()

    def continuation_pages(self, doc: D) -> int:
        """Pages `continued` takes beyond the item's own kept spans."""
        if doc.loan.view is None and doc.loan.riding is None:
            return 0
        return self.state.arena.continuation_pages(doc.loan.borrowed, len(doc.tokens) - doc.loan.borrowed)

    @staticmethod
    def computes_body(doc: D) -> bool:
        """Whether the first item computes any of the document (not when all of it is borrowed)."""
        return Lending.skipped(doc) < len(doc.tokens)

    def continued(self, doc: D, block: int | None, keep: bool) -> int | None:
        """The document's whole KV when it is kept: its view followed by the block its first item kept (the view
        alone when it borrowed the whole document); None when it is not kept."""
        view = doc.loan.view
        if view is None:
            return block
        doc.loan.view = None
        if not keep:
            self.state.arena.free(view)
            return None
        return view if block is None else self.state.arena.concat(view, block)

    def lend(self, lender: D, block: int) -> None:
        """`block` holds the lender's document: every borrower gets a view of its prefix of it. Those that
        rode in the lender's pass are in flight (their results come after the lender's) and continue it;
        the rest wait in `lent`."""
        for borrower in lender.loan.borrowers:
            borrower.loan.view = self.state.arena.view(block, borrower.loan.borrowed)
            if borrower.loan.riding is not None:
                borrower.loan.riding = None
                continue
            self.expose(borrower)
            self.lent.append(borrower)
        lender.loan.borrowers.clear()

    def expose(self, doc: D) -> None:
        """Let admission evict a waiting borrower's view; the borrower then computes its whole document."""
        if doc.loan.view is None:
            return

        def lost() -> None:
            self.state.counters.recomputed_tokens += doc.loan.borrowed
            doc.loan.view = None

        self.state.memory.keep(doc.loan.view, 1.0, lost)

    def protect(self, doc: D) -> None:
        """The borrower is being admitted: its view must stay."""
        if doc.loan.view is not None:
            self.state.memory.unkeep(doc.loan.view)

    def cancel(self, doc: D) -> None:
        """A borrower that found its whole KV elsewhere (kept by a filter) needs no view."""
        if doc.loan.view is not None:
            self.state.memory.unkeep(doc.loan.view)
            self.state.arena.free(doc.loan.view)
            doc.loan.view = None
