"""EngineConfig: which model, on which device, through which backend."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Precision = Literal["auto", "fp32", "bf16"]
Switch = Literal["auto", "on", "off"]
SWITCHES = ("auto", "on", "off")

DEFAULT_MODEL = "gemma-3-270m"
DEFAULT_DEVICE = "cpu"
DEFAULT_BACKEND = "native"
DEFAULT_COMPUTE = "local"


@dataclass(frozen=True)
class EngineConfig:
    """What a Session runs on. Names are looked up in the ExtensionRegistry."""

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
    compute: str = DEFAULT_COMPUTE
    """Where model work runs: a compute provider by name (`local` in-process, `process`, plugins' own)."""
    worker_setup: str | None = None
    """`module:function` a worker process calls with its registry before its first request (registers
    backends that no entry point provides; Ray calls its counterpart `worker_process_setup_hook`)."""
    engines_per_device: int = 1
    """Booted engines a worker keeps per device; booting one more closes the least recently used."""

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"EngineConfig.gpus must be at least 1, got {self.gpus}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"EngineConfig.precision must be 'auto', 'fp32' or 'bf16', got {self.precision!r}")
        if self.chunk_tokens < 16:
            raise ValueError(f"EngineConfig.chunk_tokens must be at least 16, got {self.chunk_tokens}")
        if self.kv_page_tokens < 1:
            raise ValueError(f"EngineConfig.kv_page_tokens must be at least 1, got {self.kv_page_tokens}")
        for name in ("prefix_sharing", "calibration"):
            if getattr(self, name) not in SWITCHES:
                raise ValueError(f"EngineConfig.{name} must be 'auto', 'on' or 'off', got {getattr(self, name)!r}")
        if not isinstance(self.compute, str) or not self.compute:
            raise ValueError(f"EngineConfig.compute must name a compute provider, got {self.compute!r}")
        if self.worker_setup is not None and self.worker_setup.count(":") != 1:
            raise ValueError(f"EngineConfig.worker_setup must be 'module:function', got {self.worker_setup!r}")
        if self.engines_per_device < 1:
            raise ValueError(f"EngineConfig.engines_per_device must be at least 1, got {self.engines_per_device}")

    def engine_settings(self) -> EngineConfig:
        """This config with every field that only planning or placement reads set to its default.

        Two configs with equal engine settings can share one booted engine.
        """
        return replace(self, prefix_sharing="auto", calibration="auto", compute=DEFAULT_COMPUTE, worker_setup=None,
                       engines_per_device=1)
