"""Quail: a query engine for AI functions in SQL.

What a user needs is here; what a backend or compute-provider author needs is in `quail.extend`.
The names load on first use (PEP 562 `__getattr__`), so `import quail.cli` starts without pyarrow
and sqlglot, and the command line can turn an interrupt that arrives while they load into a clean
exit instead of a traceback.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quail.catalog.devices import DeviceSpec
    from quail.catalog.models import ModelSpec
    from quail.client import connect
    from quail.compute.lifetime import release_engines
    from quail.config import EngineConfig
    from quail.data.providers import DocumentProvider
    from quail.errors import (
        CompileError,
        ModelFileError,
        PlanEditError,
        QuailError,
        QueryCancelledError,
        Refusal,
        RefusalError,
        ServerError,
    )
    from quail.frontend.builder import col, prompt, score
    from quail.physical.graph import PhysicalGraph
    from quail.plugins.hookspecs import hookimpl
    from quail.plugins.registry import ExtensionRegistry
    from quail.runtime.coordinator import Query
    from quail.runtime.results import QueryResult
    from quail.session import Session

_HOMES = {
    "quail.catalog.devices": ("DeviceSpec",),
    "quail.client": ("connect",),
    "quail.catalog.models": ("ModelSpec",),
    "quail.compute.lifetime": ("release_engines",),
    "quail.config": ("EngineConfig",),
    "quail.data.providers": ("DocumentProvider",),
    "quail.errors": ("CompileError", "ModelFileError", "PlanEditError", "QuailError", "QueryCancelledError", "Refusal",
                     "RefusalError", "ServerError"),
    "quail.frontend.builder": ("col", "prompt", "score"),
    "quail.physical.graph": ("PhysicalGraph",),
    "quail.plugins.hookspecs": ("hookimpl",),
    "quail.plugins.registry": ("ExtensionRegistry",),
    "quail.runtime.coordinator": ("Query",),
    "quail.runtime.results": ("QueryResult",),
    "quail.session": ("Session",),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "CompileError",
    "DeviceSpec",
    "DocumentProvider",
    "EngineConfig",
    "ExtensionRegistry",
    "ModelFileError",
    "ModelSpec",
    "PhysicalGraph",
    "PlanEditError",
    "QuailError",
    "Query",
    "QueryCancelledError",
    "QueryResult",
    "Refusal",
    "RefusalError",
    "ServerError",
    "Session",
    "col",
    "connect",
    "hookimpl",
    "prompt",
    "release_engines",
    "score",
]


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'quail' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
