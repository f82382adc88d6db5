"""Every test's answer store is its own: a fresh file per test, never the user's store under $QUAIL_HOME."""

from __future__ import annotations

import pytest

from quail.cache import STORE_ENVIRONMENT


@pytest.fixture(autouse=True)
def _own_answer_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside, not inside, the test's `tmp_path` (tests check that nothing is left there)."""
    monkeypatch.setenv(STORE_ENVIRONMENT, str(tmp_path_factory.mktemp("answers") / "answers.sqlite"))
