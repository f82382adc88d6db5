"""Entry point of quail-sglang: registers the `sglang` backend. Imports no engine."""

from __future__ import annotations

import quail
from quail.extend import Registrar
from quail_sglang.backend import SGLangBackend


@quail.hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_backend(SGLangBackend())
