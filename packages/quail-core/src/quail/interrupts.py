"""Signals on the command line: Ctrl-C and SIGTERM end a run the way an error does.

SIGINT raises KeyboardInterrupt (Python's own handler) and SIGTERM raises `Terminated`, so the
`with Session` blocks and output files unwind their clean-up — token files, temporary outputs —
before the command exits 128 + the signal number, without a traceback. Only the command line
installs this: a library never takes over a program's signals.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so `except Exception` never swallows it."""

    def __init__(self, signal_number: int) -> None:
        self.signal_number = signal_number
        super().__init__(f"terminated by signal {signal_number}")


class Cancelled(BaseException):
    """Someone asked for the running query to stop (`quail serve`'s cancel). A BaseException like the signals: the
    query unwinds the way Ctrl-C unwinds it — an engine it interrupted is closed, a compute worker stopped — and
    what was answered before is kept in the answer store."""


def _raise_terminated(signal_number: int, _frame: FrameType | None) -> None:
    raise Terminated(signal_number)


@contextmanager
def signals_unwind() -> Iterator[None]:
    """While inside: SIGTERM raises `Terminated`, SIGINT raises KeyboardInterrupt (unless it is ignored,
    as for a background job). The previous handlers are restored on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_term = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
