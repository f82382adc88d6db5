"""Quail's own extensions, registered the way a third party's are: through the `quail_register` hook.

The catalog's models and devices, the logical rules and the `local` and `process` compute providers
come in through this module, loaded by `load_plugins` before the installed distributions' plugins —
the core has no private back door.
"""

from __future__ import annotations

from quail.catalog.devices import BUILT_IN_DEVICES
from quail.catalog.models import BUILT_IN_EMBEDDING_MODELS, BUILT_IN_MODELS
from quail.compute.local import LocalProvider
from quail.compute.process import ProcessProvider
from quail.logical.rules import BUILT_IN_RULES
from quail.plugins.hookspecs import Registrar, hookimpl


@hookimpl
def quail_register(registry: Registrar) -> None:
    for model in (*BUILT_IN_MODELS, *BUILT_IN_EMBEDDING_MODELS):
        registry.register_model(model)
    for device in BUILT_IN_DEVICES:
        registry.register_device(device)
    for rule in BUILT_IN_RULES:
        registry.register_logical_rule(rule)
    registry.register_compute(LocalProvider())
    registry.register_compute(ProcessProvider())
