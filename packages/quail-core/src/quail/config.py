"""EngineConfig: which model, on which device, through which backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Precision = Literal["auto", "fp32", "bf16"]
Switch = Literal["auto", "on", "off"]
SWITCHES = ("auto", "on", "off")

DEFAULT_MODEL = "gemma-3-270m"
DEFAULT_DEVICE = "cpu"
DEFAULT_BACKEND = "native"


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
