"""Request planning and scheduling shared by the request backends (vLLM, SGLang), engine-agnostic.

A backend plans with the native planner (the same filter order, joins and anchors), wraps its
engine in an adapter that plays `RequestEngine`, and answers model nodes one by one through
`RequestModelExecution`; `RequestBackend` does all of it, so an engine package adds only its
`supports` check and a boot function. Nothing here imports an engine or torch.
"""

from quail.requests.backend import RequestBackend
from quail.requests.engine import (
    EmbedsText,
    EngineAnswer,
    EngineGeneration,
    EngineRequest,
    GeneratesText,
    ReadsContinuations,
    RequestEngine,
    margin_of,
)
from quail.requests.execution import RequestModelExecution
from quail.requests.strategies import FilterStrategy, JoinStrategy, RequestStrategy

__all__ = [
    "EmbedsText",
    "EngineAnswer",
    "EngineGeneration",
    "EngineRequest",
    "FilterStrategy",
    "GeneratesText",
    "JoinStrategy",
    "ReadsContinuations",
    "RequestBackend",
    "RequestEngine",
    "RequestModelExecution",
    "RequestStrategy",
    "margin_of",
]
