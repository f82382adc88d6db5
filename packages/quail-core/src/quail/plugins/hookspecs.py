"""Every hook a Quail plugin may implement. Reading this file tells the whole extension surface.

A plugin is a plain module named by an entry point in group ``quail`` of its distribution::

    [project.entry-points.quail]
    mybackend = "my_package.plugin"

whose ``@quail.hookimpl`` functions Quail calls when `ExtensionRegistry.with_built_ins()` runs.
By convention the entry-point name is the name of the backend the plugin provides.
"""

from __future__ import annotations

import argparse

import pluggy

from quail.plugins.kinds import Registrar

PROJECT = "quail"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)



@hookspec
def quail_register(registry: Registrar) -> None:
    """Register this plugin's backends, models, devices, logical rules and compute providers.

    Called once per plugin when a registry loads the installed plugins. Keep it cheap: import
    heavy engines (torch, vllm) lazily, inside the backend's methods, so that listing backends
    stays fast and a missing engine is reported by `supports()` rather than at import.
    If it raises or registers something invalid, none of its registrations are kept, the failure
    is reported, and every other plugin still loads.
    """


@hookspec
def quail_add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add subcommands to the `quail` command line (e.g. quail-native adds `quail bench`).

    Each added parser must `set_defaults(handler=callable(args) -> int)`. Called when the CLI
    builds its parser; a plugin that raises here is skipped with a warning.
    """
