"""Entry point of quail-vllm: registers the `vllm` backend. Imports no engine."""

from __future__ import annotations

import quail
from quail.plugins.hookspecs import Registrar
from quail_vllm.backend import VLLMBackend


@quail.hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_backend(VLLMBackend())
