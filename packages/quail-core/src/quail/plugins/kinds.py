"""The kinds of extension a plugin may register, who registered one, and the one way registrations are made.

`Registrar` is what a plugin's `quail_register` hook receives; `ExtensionRegistry` and the loader's staging
area are both Registrars, so the `register_*` methods are written once, here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from quail.backends.base import ModelBackend
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.base import ComputeProvider
from quail.logical.rules import LogicalRule

Kind = Literal["backend", "model", "device", "logical_rule", "compute"]
Extension = ModelBackend | ModelSpec | DeviceSpec | LogicalRule | ComputeProvider

# First-party backends and the distribution that provides each: named in "not installed" errors.
FIRST_PARTY_BACKENDS: Mapping[str, str] = MappingProxyType({
    "native": "quail-native",
    "vllm": "quail-vllm",
    "sglang": "quail-sglang",
})

_NAME = re.compile(r"^[a-z][a-z0-9_.\-]*$")


@dataclass(frozen=True)
class Origin:
    """Who registered an extension: a plugin's distribution, quail-core, or user code."""

    source: str
    distribution: str | None = None
    version: str | None = None

    def describe(self) -> str:
        if self.distribution is None:
            return self.source
        return f"{self.source} ({self.distribution} {self.version or '?'})"


USER_CODE = Origin("user code")
CORE = Origin("built-in catalog", "quail-core")


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or whose registrations were rejected."""

    entry_point: str
    origin: Origin
    stage: Literal["import", "register"]
    message: str
    claimed_names: tuple[str, ...] = ()

    def describe(self) -> str:
        where = self.origin.distribution or "an unknown distribution"
        version = f" {self.origin.version}" if self.origin.version else ""
        return f"plugin {self.entry_point!r} from {where}{version} failed at {self.stage}: {self.message}"

    def concerns(self, backend_name: str) -> bool:
        return backend_name == self.entry_point or backend_name in self.claimed_names


class Registrar:
    """Where registrations go: one method per kind of extension, each a batch of one (`register_all`)."""

    def register_all(self, items: list[tuple[Kind, Extension]], origin: Origin) -> None:
        raise NotImplementedError

    def register_backend(self, backend: ModelBackend, *, origin: Origin = USER_CODE) -> None:
        self.register_all([("backend", backend)], origin)

    def register_model(self, spec: ModelSpec, *, origin: Origin = USER_CODE) -> None:
        self.register_all([("model", spec)], origin)

    def register_device(self, spec: DeviceSpec, *, origin: Origin = USER_CODE) -> None:
        self.register_all([("device", spec)], origin)

    def register_logical_rule(self, rule: LogicalRule, *, origin: Origin = USER_CODE) -> None:
        """Add a rewrite run after the ones registered before it, to a fixpoint."""
        self.register_all([("logical_rule", rule)], origin)

    def register_compute(self, provider: ComputeProvider, *, origin: Origin = USER_CODE) -> None:
        """Add a compute provider, selectable by `EngineConfig(compute=name)`."""
        self.register_all([("compute", provider)], origin)


def validated_name(kind: Kind, item: object, origin: Origin) -> str:
    expected = {"backend": ModelBackend, "model": ModelSpec, "device": DeviceSpec, "logical_rule": LogicalRule,
                "compute": ComputeProvider}[kind]
    if not isinstance(item, expected):
        raise ValueError(
            f"{origin.describe()} registered {item!r} as a {kind}, but it is not a "
            f"{expected.__name__} (a {kind} needs: {_required_members(kind)})"
        )
    name = getattr(item, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"{origin.describe()} registered a {kind} named {name!r}; names are lower-case "
            "letters, digits, '.', '_' or '-', starting with a letter"
        )
    return name


def _required_members(kind: Kind) -> str:
    if kind == "backend":
        return "name, supports(), plan(), start(), execute_request()"
    if kind == "logical_rule":
        return "name, rewrite(plan)"
    if kind == "compute":
        return "name, execute(request, caller), close()"
    return "a frozen spec dataclass"
