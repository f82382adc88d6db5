"""Quail: a query engine for AI functions in SQL."""

from quail.backends.base import (
    BackendExecutionContext,
    ExecutionMetrics,
    GpuContext,
    ModelBackend,
    ModelExecution,
    ModelRegion,
    NodeInputs,
    PhysicalCandidate,
    PhysicalRequest,
    PhysicalResponse,
    PlanningContext,
    SupportResult,
    TableInput,
)
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.base import Caller, ComputeProvider
from quail.compute.lifetime import release_engines
from quail.config import EngineConfig
from quail.data.providers import DocumentProvider
from quail.errors import CompileError, PlanEditError, QuailError, Refusal, RefusalError
from quail.frontend.builder import col, prompt, score
from quail.plugins.hookspecs import hookimpl
from quail.plugins.registry import ExtensionRegistry
from quail.session import Query, Session

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
