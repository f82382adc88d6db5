"""EngineConfig: which model, on which device, through which backend."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from quail.errors import ConfigError

Precision = Literal["auto", "fp32", "bf16"]
Switch = Literal["auto", "on", "off"]
OversizedPolicy = Literal["refuse", "skip", "truncate"]
SWITCHES = ("auto", "on", "off")
PRECISIONS = ("auto", "fp32", "bf16")
OVERSIZED_POLICIES = ("refuse", "skip", "truncate")

DEFAULT_MODEL = "gemma-3-270m"
DEFAULT_DEVICE = "cpu"
DEFAULT_BACKEND = "native"
DEFAULT_COMPUTE = "local"


@dataclass(frozen=True)
class EngineConfig:
    """What a Session runs on. Names are looked up in the ExtensionRegistry.

    Every field is checked here, so a wrong type is a TypeError and a wrong value a ValueError
    (`ConfigError`) naming the field, before any session work.
    """

    model: str = DEFAULT_MODEL
    device: str = DEFAULT_DEVICE
    backend: str = DEFAULT_BACKEND
    gpus: int = 1
    chunk_tokens: int = 2048
    kv_budget_bytes: float | None = None
    precision: Precision = "auto"
    kv_page_tokens: int = 16
    prefix_sharing: Switch = "auto"
    calibration: Switch = "auto"
    oversized_documents: OversizedPolicy = "refuse"
    """A document too long for one forward pass with its prompt: "refuse" the query (the default),
    "skip" that document (it leaves the query), or "truncate" it to the tokens that fit. Skipped and
    truncated documents are counted in the report and named in the plan's remarks."""
    compute: str = DEFAULT_COMPUTE
    """Where model work runs: a compute provider by name (`local` in-process, `process`, plugins' own)."""
    worker_setup: str | None = None
    """`module:function` a worker process calls with its registry before its first request (registers
    backends that no entry point provides; Ray calls its counterpart `worker_process_setup_hook`)."""
    engines_per_device: int = 1
    """Booted engines a worker keeps per device; booting one more closes the least recently used."""

    def __post_init__(self) -> None:
        for name in ("model", "device", "backend"):
            _require_name(name, getattr(self, name))
        _require_count("gpus", self.gpus, 1)
        _require_count("chunk_tokens", self.chunk_tokens, 16)
        _require_count("kv_page_tokens", self.kv_page_tokens, 1)
        if self.kv_budget_bytes is not None:
            _require_positive_number("kv_budget_bytes", self.kv_budget_bytes)
        _require_choice("precision", self.precision, PRECISIONS)
        for name in ("prefix_sharing", "calibration"):
            _require_choice(name, getattr(self, name), SWITCHES)
        _require_choice("oversized_documents", self.oversized_documents, OVERSIZED_POLICIES)
        _require_name("compute", self.compute)
        if self.worker_setup is not None and (not isinstance(self.worker_setup, str) or
                                              self.worker_setup.count(":") != 1):
            raise ConfigError(f"EngineConfig.worker_setup must be 'module:function', got {self.worker_setup!r}")
        _require_count("engines_per_device", self.engines_per_device, 1)

    def engine_settings(self) -> EngineConfig:
        """This config with every field that only planning or placement reads set to its default.

        Two configs with equal engine settings can share one booted engine.
        """
        return replace(self, prefix_sharing="auto", calibration="auto", oversized_documents="refuse",
                       compute=DEFAULT_COMPUTE, worker_setup=None, engines_per_device=1)


def _require_name(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"EngineConfig.{field} must be a name (str), got {type(value).__name__} {value!r}")
    if not value.strip():
        raise ConfigError(f"EngineConfig.{field} must not be empty")


def _require_count(field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"EngineConfig.{field} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ConfigError(f"EngineConfig.{field} must be at least {minimum}, got {value}")


def _require_positive_number(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"EngineConfig.{field} must be a number of bytes or None, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"EngineConfig.{field} must be a positive, finite number of bytes (or None for the "
                          f"backend's default), got {value!r}")


def _require_choice(field: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        spelled = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"EngineConfig.{field} must be one of {spelled}, got {value!r}")
