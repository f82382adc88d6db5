"""Scratch directories: a killed process's token and view files go when the next directory is made.

The owner of each directory holds a lock on a file in it; whoever can take that lock knows the
owner is gone. Checked with real processes: one killed by SIGKILL after a query, one still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from quail.data.scratch import OWNER_LOCK, ScratchDirectory, remove_abandoned

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="owner locks are POSIX flock")

QUERY_THEN = """
import os, signal, sys
sys.path[:0] = {paths!r}
from support.cases import keyword_session

with keyword_session() as session:
    session.sql("SELECT r.id FROM reviews r WHERE r.stars >= 3 AND AI_FILTER(PROMPT('Good? {{0}}', r.body))").collect()
    print(" ".join(sorted(os.listdir({scratch!r}))), flush=True)
    {then}
"""


def quail_process(tmp_path: Path, then: str) -> tuple[subprocess.Popen[str], set[str]]:
    """A Python process that ran queries with its temporary directory in `tmp_path`; its directories there."""
    script = tmp_path / f"process-{len(list(tmp_path.glob('process-*')))}.py"
    script.write_text(textwrap.dedent(QUERY_THEN.format(
        paths=[p for p in sys.path if p], scratch=str(tmp_path), then=then)))
    process = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1"))
    assert process.stdout is not None
    listed = set(process.stdout.readline().split())
    assert listed, process.stderr.read() if process.stderr else ""
    return process, {name for name in listed if name.startswith("quail-")}


@pytest.fixture
def scratch_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_killed_processs_directories_go_when_the_next_is_made_and_a_live_ones_stay(scratch_here):
    alive, alive_directories = quail_process(scratch_here, "sys.stdin.readline()")
    try:
        killed, listed = quail_process(scratch_here, "os.kill(os.getpid(), signal.SIGKILL)")
        killed.communicate(timeout=60)
        assert killed.returncode == -signal.SIGKILL
        killed_directories = listed - alive_directories
        for directories in (alive_directories, killed_directories):
            assert {name.rsplit("-", 1)[0] for name in directories} == {"quail-tokens", "quail-views"}
        assert all((scratch_here / name).exists() for name in alive_directories | killed_directories)

        mine = ScratchDirectory("tokens")
        assert {path.name for path in scratch_here.glob("quail-*")} == alive_directories | {mine.path.name}
        mine.remove()
        assert not mine.path.exists()
    finally:
        alive.communicate("\n", timeout=60)
    assert alive.returncode == 0
    assert not list(scratch_here.glob("quail-*")), "a process that ends normally removes its own"


def test_a_directory_this_process_still_owns_is_never_swept(scratch_here):
    first = ScratchDirectory("tokens")
    (first.path / "tokens.arrow").write_bytes(b"data")
    second = ScratchDirectory("views")
    assert remove_abandoned(scratch_here) == []
    assert (first.path / "tokens.arrow").exists() and second.path.exists()
    first.remove()
    second.remove()
    first.remove()  # twice is harmless
    assert not list(scratch_here.iterdir())


def test_directories_without_an_owner_lock_are_left_alone(scratch_here):
    foreign = scratch_here / "quail-someone-elses"
    foreign.mkdir()
    (foreign / "data.arrow").write_bytes(b"data")
    abandoned = scratch_here / "quail-tokens-abandoned"
    abandoned.mkdir()
    (abandoned / OWNER_LOCK).touch()  # its owner's lock went with it
    assert remove_abandoned(scratch_here) == [abandoned]
    assert (foreign / "data.arrow").exists() and not abandoned.exists()
