"""EngineConfig: which model, on which device, through which backend."""

from __future__ import annotations

from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"EngineConfig.gpus must be at least 1, got {self.gpus}")
