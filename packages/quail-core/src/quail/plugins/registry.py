"""ExtensionRegistry: every backend, model and device a session can name, and who added it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from quail.backends.base import ModelBackend
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.base import ComputeProvider
from quail.compute.request import NodeMetrics
from quail.errors import Refusal, RefusalError
from quail.logical.rules import LogicalRule
from quail.physical.nodes import PhysicalNode
from quail.plugins.kinds import (
    FIRST_PARTY_BACKENDS,
    Extension,
    Kind,
    Origin,
    PluginFailure,
    Registrar,
    validated_name,
)
from quail.progress import ProgressListener

Observer = Callable[[PhysicalNode, NodeMetrics], None]


class ExtensionRegistry(Registrar):
    """Names → extensions, with read-only views. Registration validates and never overwrites."""

    def __init__(self) -> None:
        self._backends: dict[str, ModelBackend] = {}
        self._models: dict[str, ModelSpec] = {}
        self._devices: dict[str, DeviceSpec] = {}
        self._rules: dict[str, LogicalRule] = {}
        self._computes: dict[str, ComputeProvider] = {}
        self._observers: list[Observer] = []
        self._progress: list[ProgressListener] = []
        self._origins: dict[tuple[Kind, str], Origin] = {}
        self._failures: list[PluginFailure] = []

    @classmethod
    def with_built_ins(cls) -> ExtensionRegistry:
        """Quail's built-in plugin plus every installed plugin (entry-point group ``quail``)."""
        from quail.plugins.loading import load_plugins

        registry = cls()
        load_plugins(registry)  # the built-in plugin (quail.plugins.builtin) first, then the installed ones
        return registry

    # -- registration -------------------------------------------------------------------------

    def register_all(self, items: list[tuple[Kind, Extension]], origin: Origin) -> None:
        """Validate every item first, then add them all: a batch lands whole or not at all."""
        claimed: dict[tuple[Kind, str], Origin] = {}
        for kind, item in items:
            key = (kind, validated_name(kind, item, origin))
            earlier = self._origins.get(key) or claimed.get(key)
            if earlier is not None:
                raise ValueError(
                    f"{kind} {key[1]!r} is already registered by {earlier.describe()}; "
                    f"{origin.describe()} tried to register it again"
                )
            claimed[key] = origin
        for kind, item in items:
            self._add(kind, item)
        self._origins.update(claimed)

    def _add(self, kind: Kind, item: Extension) -> None:
        if isinstance(item, ModelSpec):
            self._models[item.name] = item
        elif isinstance(item, DeviceSpec):
            self._devices[item.name] = item
        elif kind == "logical_rule":
            self._rules[item.name] = item
        elif kind == "compute":
            self._computes[item.name] = item
        else:
            self._backends[item.name] = item

    def record_failure(self, failure: PluginFailure) -> None:
        self._failures.append(failure)

    # -- read-only views ----------------------------------------------------------------------

    @property
    def backends(self) -> Mapping[str, ModelBackend]:
        return MappingProxyType(self._backends)

    @property
    def models(self) -> Mapping[str, ModelSpec]:
        return MappingProxyType(self._models)

    @property
    def devices(self) -> Mapping[str, DeviceSpec]:
        return MappingProxyType(self._devices)

    @property
    def computes(self) -> Mapping[str, ComputeProvider]:
        return MappingProxyType(self._computes)

    def register_observer(self, observer: Observer) -> None:
        """Called once per node run, with its metrics: progress bars, tracing, tests."""
        if not callable(observer):
            raise ValueError(f"an observer is a callable (node, metrics), got {observer!r}")
        self._observers.append(observer)

    @property
    def observers(self) -> tuple[Observer, ...]:
        return tuple(self._observers)

    def register_progress_listener(self, listener: ProgressListener) -> None:
        """Called with (node, items done, items total) while a backend works on a model node."""
        if not callable(listener):
            raise ValueError(f"a progress listener is a callable (node, done, total), got {listener!r}")
        self._progress.append(listener)

    def unregister_progress_listener(self, listener: ProgressListener) -> None:
        self._progress.remove(listener)

    @property
    def progress_listeners(self) -> tuple[ProgressListener, ...]:
        return tuple(self._progress)

    @property
    def logical_rules(self) -> tuple[LogicalRule, ...]:
        """Rules in registration order: the built-ins first, then the ones plugins and users add."""
        return tuple(self._rules.values())

    @property
    def plugin_failures(self) -> tuple[PluginFailure, ...]:
        return tuple(self._failures)

    def origin(self, kind: Kind, name: str) -> Origin:
        return self._origins[(kind, name)]

    # -- lookups that refuse with a useful message --------------------------------------------

    def backend(self, name: str) -> ModelBackend:
        found = self.backends.get(name)
        if found is not None:
            return found
        reasons = [f"installed backends: {_listing(self.backends)}"]
        reasons.extend(f.describe() for f in self._failures if f.concerns(name))
        hints = ()
        if name in FIRST_PARTY_BACKENDS and not any(f.concerns(name) for f in self._failures):
            hints = (f"install it: pip install {FIRST_PARTY_BACKENDS[name]}",)
        raise RefusalError(Refusal(f"unknown backend {name!r}", tuple(reasons), hints=hints))

    def compute(self, name: str) -> ComputeProvider:
        found = self.computes.get(name)
        if found is None:
            raise RefusalError(Refusal(f"unknown compute provider {name!r}",
                                       (f"installed compute providers: {_listing(self.computes)}",)))
        return found

    def model(self, name: str) -> ModelSpec:
        found = self.models.get(name)
        if found is None:
            raise RefusalError(Refusal(f"unknown model {name!r}", (f"known models: {_listing(self.models)}",)))
        return found

    def device(self, name: str) -> DeviceSpec:
        found = self.devices.get(name)
        if found is None:
            raise RefusalError(Refusal(f"unknown device {name!r}", (f"known devices: {_listing(self.devices)}",)))
        return found


def _listing(names: Mapping[str, object]) -> str:
    return ", ".join(sorted(names)) or "none"


def _listing(names: Mapping[str, object]) -> str:
    return ", ".join(sorted(names)) or "none"
