"""Quail: a query engine for AI functions in SQL.

The public names below load on first use (PEP 562 `__getattr__`), so `import quail.cli` starts
without pyarrow and sqlglot, and the command line can turn an interrupt that arrives while they
load into a clean exit instead of a traceback.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quail.backends.base import (
        BackendExecutionContext,
        GpuContext,
        ModelBackend,
        ModelExecution,
        ModelIdentity,
        ModelIdentitySource,
        ModelRegion,
        NodeInputs,
        PhysicalCandidate,
        PlanningContext,
        SupportResult,
    )
    from quail.catalog.devices import DeviceSpec
    from quail.catalog.models import ModelSpec
    from quail.compute.base import Caller, ComputeProvider
    from quail.compute.lifetime import release_engines
    from quail.compute.request import ExecutionMetrics, PhysicalRequest, PhysicalResponse, TableInput
    from quail.config import EngineConfig
    from quail.data.providers import DocumentProvider
    from quail.errors import CompileError, ModelFileError, PlanEditError, QuailError, Refusal, RefusalError
    from quail.frontend.builder import col, prompt, score
    from quail.plugins.hookspecs import hookimpl
    from quail.plugins.registry import ExtensionRegistry
    from quail.session import Query, Session

_HOMES = {
    "quail.backends.base": ("BackendExecutionContext", "ExecutionMetrics", "GpuContext", "ModelBackend",
                            "ModelExecution", "ModelIdentity", "ModelIdentitySource", "ModelRegion", "NodeInputs",
                            "PhysicalCandidate", "PhysicalRequest", "PhysicalResponse", "PlanningContext",
                            "SupportResult", "TableInput"),
    "quail.catalog.devices": ("DeviceSpec",),
    "quail.catalog.models": ("ModelSpec",),
    "quail.compute.base": ("Caller", "ComputeProvider"),
    "quail.compute.lifetime": ("release_engines",),
    "quail.config": ("EngineConfig",),
    "quail.data.providers": ("DocumentProvider",),
    "quail.errors": ("CompileError", "ModelFileError", "PlanEditError", "QuailError", "Refusal", "RefusalError"),
    "quail.frontend.builder": ("col", "prompt", "score"),
    "quail.plugins.hookspecs": ("hookimpl",),
    "quail.plugins.registry": ("ExtensionRegistry",),
    "quail.session": ("Query", "Session"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "BackendExecutionContext",
    "Caller",
    "CompileError",
    "ComputeProvider",
    "DeviceSpec",
    "DocumentProvider",
    "EngineConfig",
    "ExecutionMetrics",
    "ExtensionRegistry",
    "GpuContext",
    "ModelBackend",
    "ModelExecution",
    "ModelFileError",
    "ModelIdentity",
    "ModelIdentitySource",
    "ModelRegion",
    "ModelSpec",
    "NodeInputs",
    "PhysicalCandidate",
    "PhysicalRequest",
    "PhysicalResponse",
    "PlanEditError",
    "PlanningContext",
    "QuailError",
    "Query",
    "Refusal",
    "RefusalError",
    "Session",
    "SupportResult",
    "TableInput",
    "col",
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
