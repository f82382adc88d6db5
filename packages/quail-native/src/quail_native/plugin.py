"""Entry point of quail-native: registers the `native` backend. Imports no torch."""

from __future__ import annotations

import argparse

import quail
from quail.extend import Registrar
from quail_native.backend import NativeBackend


@quail.hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_backend(NativeBackend())


@quail.hookimpl
def quail_add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from quail_native.benchmark.cli import add_command

    add_command(commands)
