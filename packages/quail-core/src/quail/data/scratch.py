"""Temporary directories a process owns, and the removal of those whose process died.

A session removes its token and view files when it closes or is collected. A process killed by
SIGKILL or by the kernel's out-of-memory killer cannot, and a large corpus's token files would stay
in the temporary directory for good. So each directory holds a lock file that its process keeps
locked (`flock`) while the directory lives; the kernel drops the lock when the process ends,
however it ends, and across PID namespaces that share the directory. Making a new directory first
removes every sibling whose lock can be taken: nobody owns it any more.

The lock file is locked under a private name and only then renamed to `OWNER_LOCK`, so no other
process ever sees it unlocked while its owner lives. Directories without one (another program's,
or one being made this instant) are never touched. Where `fcntl` is missing (Windows) directories
are made and removed the same way but nothing is swept.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

PREFIX = "quail-"
OWNER_LOCK = ".quail-owner.lock"

_OWNED: set[Path] = set()
"""This process's own directories: never tried, so where `flock` is emulated by per-process POSIX locks
(NFS) a process neither takes nor, on closing, drops its own lock."""


class ScratchDirectory:
    """A fresh `quail-<kind>-…` directory under the temporary directory, removed by `remove()` or after
    its process dies (by the next one made there)."""

    def __init__(self, kind: str) -> None:
        parent = Path(tempfile.gettempdir())
        remove_abandoned(parent)
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=parent))
        self._lock = _hold_owner_lock(self.path)
        _OWNED.add(self.path)

    def remove(self) -> None:
        """Delete the directory and everything in it, then let go of the lock; safe to call twice."""
        shutil.rmtree(self.path, ignore_errors=True)
        _OWNED.discard(self.path)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def remove_abandoned(parent: Path) -> list[Path]:
    """Remove the `quail-*` directories in `parent` whose owning process has ended; the ones removed."""
    if fcntl is None:
        return []
    removed = []
    for lock in parent.glob(f"{PREFIX}*/{OWNER_LOCK}"):
        if lock.parent not in _OWNED and _remove_if_unowned(lock):
            removed.append(lock.parent)
    return removed


def _remove_if_unowned(lock: Path) -> bool:
    try:
        descriptor = os.open(lock, os.O_RDWR)
    except OSError:  # removed meanwhile, or another user's
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # its owner still holds it
        os.close(descriptor)
        return False
    try:
        shutil.rmtree(lock.parent, ignore_errors=True)
    finally:
        os.close(descriptor)
    return True


def _hold_owner_lock(directory: Path) -> int | None:
    """Lock a new file under a private name, then give it the name sweepers look for."""
    if fcntl is None:
        return None
    private = directory / f".{os.getpid()}.locking"
    descriptor = os.open(private, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(private, directory / OWNER_LOCK)
    except BaseException:
        os.close(descriptor)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return descriptor
