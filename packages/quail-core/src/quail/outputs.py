"""Output files: the destination is checked before any model work, and rows replace it atomically.

The rows are written to a temporary file in the destination's directory and renamed over the
destination only once complete (`os.replace`), so a write that fails midway — a full disk, a
file-size limit, a bug in a writer, an interrupt — leaves the previous file as it was and no
temporary file behind.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from quail.errors import UsageError

OUTPUT_SUFFIXES = (".parquet", ".csv", ".json", ".jsonl")

TableWriter = Callable[[pa.Table, Path, str], None]
"""(table, path, suffix): writes the table to the path in the format the suffix names."""


@dataclass(frozen=True)
class OutputTarget:
    """A destination known to be writable when it was checked (the path with symlinks resolved)."""

    path: Path
    shown: Path

    @property
    def suffix(self) -> str:
        """The format the rows are written in (lower case, with its dot)."""
        return self.path.suffix.lower()

    @classmethod
    def checked(cls, path: Path) -> OutputTarget:
        """Refuse, with the reason, a destination the rows could never be written to."""
        if path.suffix.lower() not in OUTPUT_SUFFIXES:
            raise UsageError(f"--output {path}: write one of {', '.join(OUTPUT_SUFFIXES)}")
        resolved = path.expanduser().resolve()
        directory = resolved.parent
        if not directory.exists():
            raise UsageError(f"--output {path}: the directory {directory} does not exist")
        if not directory.is_dir():
            raise UsageError(f"--output {path}: {directory} is not a directory")
        if resolved.is_dir():
            raise UsageError(f"--output {path}: is a directory; name a file inside it")
        if resolved.exists() and not resolved.is_file():
            raise UsageError(f"--output {path}: is not a regular file")
        if resolved.exists() and not os.access(resolved, os.W_OK):
            raise UsageError(f"--output {path}: the file is not writable")
        _probe(directory, path)
        return cls(resolved, path)

    def write(self, table: pa.Table, writer: TableWriter) -> None:
        """Write `table` beside the destination, then rename it into place; the old file survives a failure."""
        temporary = _temporary_file(self.path.parent, self.path.name, self.shown)
        try:
            writer(table, temporary, self.suffix)
            _flush_to_disk(temporary)
            temporary.chmod(self._mode())
            os.replace(temporary, self.path)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            raise UsageError(f"--output {self.shown}: writing failed ({error.strerror or error}); "
                             f"the previous file, if any, is unchanged") from None
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def _mode(self) -> int:
        """The existing file's permissions, else what a newly created file gets under the umask."""
        try:
            return stat.S_IMODE(self.path.stat().st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            return 0o666 & ~umask


def _temporary_file(directory: Path, name: str, shown: Path) -> Path:
    try:
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".part")
    except OSError as error:
        raise UsageError(f"--output {shown}: cannot create a file in {directory} ({error.strerror or error})") from None
    os.close(handle)
    return Path(temporary)


def _probe(directory: Path, shown: Path) -> None:
    """Create and remove a file where the rows will go: the only sure test that writing is allowed."""
    _temporary_file(directory, shown.name, shown).unlink()


def _flush_to_disk(path: Path) -> None:
    with path.open("rb+") as handle:
        os.fsync(handle.fileno())
