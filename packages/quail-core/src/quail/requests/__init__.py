"""Request planning and scheduling shared by the request backends (vLLM, SGLang), engine-agnostic.

A backend plans with `plan_requests` (the native planner's decisions folded into one
`RequestExecution` node), wraps its engine in an adapter that plays `RequestEngine`, and runs the
node with `execute_requests`; `RequestBackend` does all three, so an engine package adds only its
`supports` check and a boot function. Nothing here imports an engine or torch.
"""

from quail.requests.backend import RequestBackend
from quail.requests.engine import EngineAnswer, EngineRequest, RequestEngine, margin_of
from quail.requests.execution import RequestModelExecution, execute_requests
from quail.requests.node import EqualityPairs, FilterStrategy, JoinStrategy, RequestExecution, RequestStrategy
from quail.requests.planning import plan_requests

__all__ = [
    "EngineAnswer",
    "EngineRequest",
    "EqualityPairs",
    "FilterStrategy",
    "JoinStrategy",
    "RequestBackend",
    "RequestEngine",
    "RequestExecution",
    "RequestModelExecution",
    "RequestStrategy",
    "execute_requests",
    "margin_of",
    "plan_requests",
]
