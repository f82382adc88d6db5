"""Checks of what callers hand a Session: a wrong type is a TypeError and a wrong value a ValueError,
each naming the argument, before it can fail deep inside with an unrelated message."""

from __future__ import annotations

from quail.backends.base import PhysicalCandidate
from quail.catalog.devices import DeviceSpec
from quail.config import EngineConfig
from quail.errors import ConfigError
from quail.physical.graph import PhysicalGraph


def session_config(config: object) -> EngineConfig:
    """The session's configuration: an EngineConfig, or the default one for None."""
    if config is None:
        return EngineConfig()
    if not isinstance(config, EngineConfig):
        hint = f" (to name a backend: Session(EngineConfig(backend={config!r})))" if isinstance(config, str) else ""
        raise TypeError(f"Session() takes an EngineConfig, got {type(config).__name__} {config!r}{hint}")
    return config


def check_device_count(config: EngineConfig, device: DeviceSpec) -> None:
    """A CPU is one device to a session: several make sense only for CUDA devices."""
    if device.kind == "cpu" and config.gpus != 1:
        raise ConfigError(f"EngineConfig.gpus is {config.gpus}, but device {device.name!r} is a CPU, which a "
                          f"session uses as one device: set gpus=1, or name a CUDA device")


def text_argument(what: str, value: object) -> str:
    """`value` when it is a str; bytes and everything else are refused with the argument's name."""
    if isinstance(value, str):
        return value
    hint = "; decode it first (value.decode('utf-8'))" if isinstance(value, bytes | bytearray) else ""
    raise TypeError(f"{what} must be a str, got {type(value).__name__}{hint}")


def plan_argument(plan: object) -> None:
    """Query.run(plan=...) takes a planned candidate or an edited graph; anything else would be ignored."""
    if plan is not None and not isinstance(plan, PhysicalCandidate | PhysicalGraph):
        raise TypeError(f"run(plan=...) takes a PhysicalCandidate (query.plan()) or an edited PhysicalGraph, "
                        f"got {type(plan).__name__}")
