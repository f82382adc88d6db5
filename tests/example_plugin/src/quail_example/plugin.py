"""The whole integration of a third-party backend: one hook implementation."""

from __future__ import annotations

import quail
from quail.plugins.hookspecs import Registrar
from quail_example.backend import ExampleBackend


@quail.hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_backend(ExampleBackend())
