"""Entry point of quail-native: registers the `native` backend. Imports no torch."""

from __future__ import annotations

import quail
from quail.plugins.hookspecs import Registrar
from quail_native.backend import NativeBackend


@quail.hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_backend(NativeBackend())
