"""The whole integration of a third-party backend: one hook implementation."""

from __future__ import annotations

import quail
from quail.plugins.hookspecs import Registrar
from quail_example.backend import ExampleBackend, ExampleKeywordBackend


@quail.hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_backend(ExampleBackend())
    # The deterministic CPU backend of quail.testing, made selectable by name in this test environment only
    # (the CLI tests drive `quail query --backend example-keyword`).
    registry.register_backend(ExampleKeywordBackend())
