"""Which backends this installation has and whether each runs a model on a device: `quail backends`, and the
server's `/v1/backends`, say the same thing from here."""

from __future__ import annotations

from dataclasses import dataclass

from quail.backends.base import ModelBackend
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.plugins.kinds import FIRST_PARTY_BACKENDS
from quail.plugins.registry import ExtensionRegistry


@dataclass(frozen=True)
class BackendStatus:
    """One backend's verdict for a model on a device, in words; `distribution` is '-' when not installed."""

    name: str
    distribution: str
    status: str

    @property
    def supported(self) -> bool:
        return self.status == "supported"


def backend_statuses(registry: ExtensionRegistry, model: ModelSpec, device: DeviceSpec,
                     gpus: int) -> list[BackendStatus]:
    """Every installed backend (sorted by name), then the first-party ones that are not installed."""
    rows = []
    for name, backend in sorted(registry.backends.items()):
        origin = registry.origin("backend", name)
        dist = f"{origin.distribution or '-'} {origin.version or ''}".strip()
        rows.append(BackendStatus(name, dist, support_status(backend, model, device, gpus)))
    for name, dist in FIRST_PARTY_BACKENDS.items():
        if name not in registry.backends:
            rows.append(BackendStatus(name, "-", f"not installed: pip install {dist}"))
    return rows


def support_status(backend: ModelBackend, model: ModelSpec, device: DeviceSpec, gpus: int) -> str:
    """One backend's verdict in words; a plugin whose check itself fails is listed as failed, not fatal."""
    try:
        verdict = backend.supports(model, device, gpus)
    except Exception as exc:  # a plugin's bug must not hide the other backends
        return f"failed: supports() raised {type(exc).__name__}: {exc}"
    return "supported" if verdict.accepted else f"not supported: {verdict.reason}"
