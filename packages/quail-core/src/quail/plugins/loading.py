"""Load installed plugins through pluggy entry points, one at a time, so one failure stays local."""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

import pluggy

from quail.backends.base import ModelBackend
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.base import ComputeProvider
from quail.logical.rules import LogicalRule
from quail.plugins import hookspecs
from quail.plugins.registry import (
    Extension,
    ExtensionRegistry,
    Kind,
    Origin,
    PluginFailure,
)

GROUP = hookspecs.PROJECT


class PluginLoadWarning(UserWarning):
    """A plugin failed to load; the others were loaded and the reason is remembered."""


@dataclass
class _StagedRegistrar:
    """Collects one plugin's registrations so they can land together or not at all."""

    items: list[tuple[Kind, Extension]] = field(default_factory=list)

    def register_backend(self, backend: ModelBackend) -> None:
        self.items.append(("backend", backend))

    def register_model(self, spec: ModelSpec) -> None:
        self.items.append(("model", spec))

    def register_device(self, spec: DeviceSpec) -> None:
        self.items.append(("device", spec))

    def register_logical_rule(self, rule: LogicalRule) -> None:
        self.items.append(("logical_rule", rule))

    def register_compute(self, provider: ComputeProvider) -> None:
        self.items.append(("compute", provider))

    def claimed_names(self) -> tuple[str, ...]:
        return tuple(str(getattr(item, "name", "?")) for kind, item in self.items if kind == "backend")


def plugin_manager() -> pluggy.PluginManager:
    manager = pluggy.PluginManager(GROUP)
    manager.add_hookspecs(hookspecs)
    return manager


def load_plugins(registry: ExtensionRegistry, group: str = GROUP) -> None:
    """Import each entry point of `group`, collect each plugin's registrations, then commit them.

    A plugin whose entry-point name is the backend it registers commits first, so an impostor
    claiming a name that another plugin's entry point carries loses, whatever the sort order.
    """
    manager = plugin_manager()
    staged: list[tuple[str, Origin, _StagedRegistrar]] = []
    for entry in _unique_entry_points(group):
        origin = _origin(entry)
        try:
            manager.load_setuptools_entrypoints(group, name=entry.name)
        except Exception as exc:  # a broken plugin must not break the engine
            _fail(registry, PluginFailure(entry.name, origin, "import", _message(exc)))
            continue
        registrar = _collect(registry, manager, entry.name, origin)
        if registrar is not None:
            staged.append((entry.name, origin, registrar))
    staged.sort(key=lambda item: not set(item[2].claimed_names()) <= {item[0]})
    for name, origin, registrar in staged:
        try:
            registry.register_all(registrar.items, origin)
        except ValueError as exc:
            _fail(registry, PluginFailure(name, origin, "register", str(exc), registrar.claimed_names()))


def _collect(registry: ExtensionRegistry, manager: pluggy.PluginManager, name: str,
             origin: Origin) -> _StagedRegistrar | None:
    plugin = manager.get_plugin(name)
    implementations = [i for i in manager.hook.quail_register.get_hookimpls() if i.plugin is plugin]
    if not implementations:
        _fail(registry, PluginFailure(name, origin, "register", "it implements no quail hook"))
        return None
    staged = _StagedRegistrar()
    try:
        for implementation in implementations:
            implementation.function(registry=staged)
    except Exception as exc:  # a plugin's own bug stays its own
        _fail(registry, PluginFailure(name, origin, "register", _message(exc), staged.claimed_names()))
        return None
    return staged


def _unique_entry_points(group: str) -> list[EntryPoint]:
    seen: dict[str, EntryPoint] = {}
    for entry in entry_points(group=group):
        seen.setdefault(entry.name, entry)
    return sorted(seen.values(), key=lambda e: e.name)


def _origin(entry: EntryPoint) -> Origin:
    dist = entry.dist
    label = f"plugin {entry.name!r}"
    if dist is None:
        return Origin(label)
    return Origin(label, dist.metadata["Name"], dist.version)


def _message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _fail(registry: ExtensionRegistry, failure: PluginFailure) -> None:
    registry.record_failure(failure)
    warnings.warn(failure.describe(), PluginLoadWarning, stacklevel=3)


def add_plugin_commands(commands: argparse._SubParsersAction, group: str = GROUP) -> None:  # type: ignore[type-arg]
    """Let every installed plugin add its `quail` subcommands; one that fails is skipped with a warning."""
    manager = plugin_manager()
    for entry in _unique_entry_points(group):
        try:
            manager.load_setuptools_entrypoints(group, name=entry.name)
        except Exception:  # reported by the registry when backends load; the CLI just goes on
            continue
    for implementation in manager.hook.quail_add_commands.get_hookimpls():
        try:
            implementation.function(commands=commands)
        except Exception as exc:  # a plugin's command must not break the CLI
            warnings.warn(f"plugin {implementation.plugin_name!r} could not add its commands: {_message(exc)}",
                          PluginLoadWarning, stacklevel=2)
