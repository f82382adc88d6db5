"""Entry point of quail-ray: registers the compute provider `ray`. Imports no Ray (that waits for a query)."""

from __future__ import annotations

import quail
from quail.extend import Registrar
from quail_ray.provider import RayProvider


@quail.hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_compute(RayProvider())
