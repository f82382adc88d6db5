"""Fixtures every test gets: its own answer store, the run's own precision probe records, and a check that
nothing it killed left files in /tmp."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from quail.cache import STORE_ENVIRONMENT
from quail.data.scratch import remove_abandoned

try:  # quail-native installed: its engines' precision probes go to the run's own directory
    from quail_native.precision_record import RECORDS_ENVIRONMENT
except ImportError:  # quail-core alone (its own tests): nothing probes
    RECORDS_ENVIRONMENT = None


@pytest.fixture(scope="session", autouse=True)
def _session_answer_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """For module- and session-scoped fixtures that run queries before any test's own store exists."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STORE_ENVIRONMENT, str(tmp_path_factory.mktemp("answers") / "answers.sqlite"))
        yield


@pytest.fixture(scope="session", autouse=True)
def _session_precision_records(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's engines probe the CPU's precision once for the run, never into the user's cache: a probe
    taken while tests load the machine must not decide the user's real queries."""
    with pytest.MonkeyPatch.context() as patch:
        if RECORDS_ENVIRONMENT is not None:
            patch.setenv(RECORDS_ENVIRONMENT, str(tmp_path_factory.mktemp("precision")))
        yield


@pytest.fixture(autouse=True)
def _own_answer_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside, not inside, the test's `tmp_path` (tests check that nothing is left there)."""
    monkeypatch.setenv(STORE_ENVIRONMENT, str(tmp_path_factory.mktemp("answers") / "answers.sqlite"))


@pytest.fixture(autouse=True)
def _nothing_abandoned_in_the_temporary_directory() -> Iterator[None]:
    """A test that kills a Quail process gives it a TMPDIR of its own: no scratch directory it could not
    remove reaches the system's temporary directory (the next Quail process there would sweep it)."""
    yield
    abandoned = remove_abandoned(Path(tempfile.gettempdir()))
    assert not abandoned, f"scratch directories left by a process that died: {abandoned}"
