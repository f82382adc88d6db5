"""Load installed plugins through pluggy entry points, one at a time, so one failure stays local."""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Protocol

import pluggy

from quail.plugins import hookspecs
from quail.plugins.kinds import CORE, FIRST_PARTY_BACKENDS, Extension, Kind, Origin, PluginFailure, Registrar

GROUP = hookspecs.PROJECT


class PluginLoadWarning(UserWarning):
    """A plugin failed to load; the others were loaded and the reason is remembered."""


class PluginHost(Protocol):
    """What plugins are loaded into (an ExtensionRegistry): batches that land whole, and failures remembered."""

    def register_all(self, items: list[tuple[Kind, Extension]], origin: Origin) -> None: ...

    def record_failure(self, failure: PluginFailure) -> None: ...


@dataclass
class _StagedRegistrar(Registrar):
    """Collects one plugin's registrations so they can land together or not at all."""

    items: list[tuple[Kind, Extension]] = field(default_factory=list)

    def register_all(self, items: list[tuple[Kind, Extension]], origin: Origin) -> None:
        self.items.extend(items)

    def claimed_names(self) -> tuple[str, ...]:
        return tuple(str(getattr(item, "name", "?")) for kind, item in self.items if kind == "backend")


def plugin_manager() -> pluggy.PluginManager:
    manager = pluggy.PluginManager(GROUP)
    manager.add_hookspecs(hookspecs)
    return manager


def load_plugins(registry: PluginHost, group: str = GROUP) -> None:
    """Import every entry point of `group`, collect each plugin's registrations, then commit them.

    Every entry point loads, even two that share a name (pluggy's `load_setuptools_entrypoints`
    would keep whichever distribution comes first on sys.path and skip the other in silence).
    Commits run in `_precedence` order, so a backend name claimed twice keeps its rightful owner —
    the first-party distribution for a first-party name — and the other claim is reported with a
    warning naming both distributions.
    """
    manager = plugin_manager()
    _load_built_ins(registry, manager)
    staged: list[tuple[EntryPoint, Origin, _StagedRegistrar]] = []
    for entry in _entry_points(group):
        origin = _origin(entry)
        plugin = _load(manager, entry, origin, registry)
        if plugin is None:
            continue
        registrar = _collect(registry, manager, plugin, entry.name, origin)
        if registrar is not None:
            staged.append((entry, origin, registrar))
    staged.sort(key=_precedence)
    for entry, origin, registrar in staged:
        try:
            registry.register_all(registrar.items, origin)
        except ValueError as exc:
            _fail(registry, PluginFailure(entry.name, origin, "register", str(exc), registrar.claimed_names()))


def _load_built_ins(registry: PluginHost, manager: pluggy.PluginManager) -> None:
    """Core's own plugin, first and through the same hook; its failure is a bug of Quail's, so it raises."""
    from quail.plugins import builtin

    manager.register(builtin, name="quail:built-in")
    registrar = _collect(registry, manager, builtin, "built-in", CORE)
    if registrar is None:
        raise RuntimeError("Quail's built-in plugin registered nothing")
    registry.register_all(registrar.items, CORE)


def _load(manager: pluggy.PluginManager, entry: EntryPoint, origin: Origin,
          registry: PluginHost | None) -> object | None:
    """Import one entry point's module and register it under a name unique to its distribution."""
    try:
        plugin = entry.load()
        manager.register(plugin, name=_plugin_name(entry))
    except Exception as exc:  # a broken plugin must not break the engine
        if registry is not None:
            _fail(registry, PluginFailure(entry.name, origin, "import", _message(exc)))
        return None
    return plugin


def _precedence(staged: tuple[EntryPoint, Origin, _StagedRegistrar]) -> tuple[int, str, str]:
    """First-party distributions first, then plugins that register only the backend their entry point names."""
    entry, origin, registrar = staged
    if origin.distribution in FIRST_PARTY_BACKENDS.values():
        rank = 0
    elif set(registrar.claimed_names()) <= {entry.name}:
        rank = 1
    else:
        rank = 2
    return rank, entry.name, origin.distribution or ""


def _collect(registry: PluginHost, manager: pluggy.PluginManager, plugin: object, name: str,
             origin: Origin) -> _StagedRegistrar | None:
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


def _entry_points(group: str) -> list[EntryPoint]:
    """Every entry point of the group, two with one name included, in a stable order."""
    return sorted(entry_points(group=group), key=lambda e: (e.name, _distribution_name(e)))


def _distribution_name(entry: EntryPoint) -> str:
    return "" if entry.dist is None else str(entry.dist.metadata["Name"])


def _plugin_name(entry: EntryPoint) -> str:
    """The name pluggy knows a plugin by: the entry point's, qualified by its distribution."""
    return f"{entry.name}:{_distribution_name(entry) or entry.value}"


def _origin(entry: EntryPoint) -> Origin:
    dist = entry.dist
    label = f"plugin {entry.name!r}"
    if dist is None:
        return Origin(label)
    return Origin(label, dist.metadata["Name"], dist.version)


def _message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _fail(registry: PluginHost, failure: PluginFailure) -> None:
    registry.record_failure(failure)
    warnings.warn(failure.describe(), PluginLoadWarning, stacklevel=3)


def add_plugin_commands(commands: argparse._SubParsersAction, group: str = GROUP) -> None:  # type: ignore[type-arg]
    """Let every installed plugin add its `quail` subcommands; one that fails is skipped with a warning."""
    manager = plugin_manager()
    for entry in _entry_points(group):
        _load(manager, entry, _origin(entry), None)  # import failures are reported when backends load
    for implementation in manager.hook.quail_add_commands.get_hookimpls():
        try:
            implementation.function(commands=commands)
        except Exception as exc:  # a plugin's command must not break the CLI
            warnings.warn(f"plugin {implementation.plugin_name!r} could not add its commands: {_message(exc)}",
                          PluginLoadWarning, stacklevel=2)
