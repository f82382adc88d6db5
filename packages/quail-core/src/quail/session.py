"""Session: one configured engine (model, device, backend) and the tables registered on it."""

from __future__ import annotations

from types import TracebackType

from quail.backends.base import ModelBackend
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig
from quail.errors import Refusal, RefusalError
from quail.plugins.registry import ExtensionRegistry


class Session:
    """Validates the configuration at once: a session that exists can run its backend."""

    def __init__(self, config: EngineConfig | None = None, *,
                 registry: ExtensionRegistry | None = None) -> None:
        self.config = config or EngineConfig()
        self.registry = registry if registry is not None else ExtensionRegistry.with_built_ins()
        self.model: ModelSpec = self.registry.model(self.config.model)
        self.device: DeviceSpec = self.registry.device(self.config.device)
        self.backend: ModelBackend = self.registry.backend(self.config.backend)
        self._check_support()
        self.runtime_state: dict[str, object] = {}
        self._closed = False

    def _check_support(self) -> None:
        verdict = self.backend.supports(self.model, self.device, self.config.gpus)
        if not verdict.accepted:
            raise RefusalError(Refusal(
                f"backend {self.backend.name!r} does not support model {self.model.name!r} "
                f"on device {self.device.name!r} with {self.config.gpus} device(s)",
                (verdict.reason or "no reason given",),
            ))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release what the session holds; safe to call twice."""
        self._closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
