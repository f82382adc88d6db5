"""Entry point of quail-vllm: registers `vllm` (pipelined) and `stock_vllm` (operator-at-a-time). Imports no engine."""

from __future__ import annotations

import quail
from quail.extend import Registrar
from quail_vllm.backend import PIPELINED, STOCK, VLLMBackend


@quail.hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_backend(VLLMBackend("vllm", PIPELINED))
    registry.register_backend(VLLMBackend("stock_vllm", STOCK))
