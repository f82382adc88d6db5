"""Engines and workers live as long as the process: released on request, and at interpreter exit."""

from __future__ import annotations

import atexit
import warnings
from collections.abc import Callable

_RELEASERS: list[Callable[[], None]] = []


def on_release(release: Callable[[], None]) -> None:
    """Have `release_engines()` (and interpreter exit) call `release`; registering twice is harmless."""
    if release not in _RELEASERS:
        _RELEASERS.append(release)


def release_engines() -> None:
    """Close every engine this process keeps and stop every compute worker it started.

    The next query boots what it needs again. Safe to call at any time between queries.
    """
    for release in list(_RELEASERS):
        release()


def _release_at_exit() -> None:
    for release in list(_RELEASERS):
        try:
            release()
        except Exception as error:  # exit must go on: one engine failing to close leaves the rest to close
            warnings.warn(f"releasing engines at exit: {type(error).__name__}: {error}", RuntimeWarning,
                          stacklevel=1)


atexit.register(_release_at_exit)
