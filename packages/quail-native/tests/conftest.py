"""Fixtures of the native executor's tests: the tiny checkpoints built once per session, the naive reference."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from naive_reference import NaiveModel, TinyModel, build_tiny_model


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared CPU: intra-op threads only add barrier waits (40× slower when contended)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    """The tiny models, sharpened and centred, built once per test session."""
    root = tmp_path_factory.mktemp("tiny-models")
    with one_torch_thread():
        return {kind: build_tiny_model(kind, root / kind) for kind in ("qwen2", "qwen3", "gemma3")}


@pytest.fixture(scope="session")
def naive_models(tiny_checkpoints: dict[str, TinyModel]) -> dict[str, NaiveModel]:
    return {kind: NaiveModel(model.path) for kind, model in tiny_checkpoints.items()}


MARGIN_LOG: dict[str, float] = {}


@pytest.fixture
def margin_log(request: pytest.FixtureRequest) -> Iterator[list[float]]:
    """Differences |engine − naive| a test saw; the worst per test is printed in the terminal summary."""
    seen: list[float] = []
    yield seen
    if seen:
        MARGIN_LOG[request.node.name] = max(seen)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per test function (worst over its parameters); every parameter set with -v."""
    if not MARGIN_LOG:
        return
    rows: dict[str, float] = {}
    for name, worst in MARGIN_LOG.items():
        key = name if terminalreporter.config.getoption("verbose") > 0 else name.split("[")[0]
        rows[key] = max(worst, rows.get(key, 0.0))
    terminalreporter.section("worst |engine − naive| margin")
    for name, worst in sorted(rows.items()):
        terminalreporter.write_line(f"{worst:9.2e}  {name}")
