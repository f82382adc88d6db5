"""Every test's answer store is its own: a fresh file per test, never the user's store under $QUAIL_HOME."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quail.cache import STORE_ENVIRONMENT


@pytest.fixture(scope="session", autouse=True)
def _session_answer_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """For module- and session-scoped fixtures that run queries before any test's own store exists."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STORE_ENVIRONMENT, str(tmp_path_factory.mktemp("answers") / "answers.sqlite"))
        yield


@pytest.fixture(autouse=True)
def _own_answer_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside, not inside, the test's `tmp_path` (tests check that nothing is left there)."""
    monkeypatch.setenv(STORE_ENVIRONMENT, str(tmp_path_factory.mktemp("answers") / "answers.sqlite"))
