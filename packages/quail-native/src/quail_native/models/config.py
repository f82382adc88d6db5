"""A typed view of a Hugging Face config.json: the values the architectures read, checked on access."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]


@dataclass(frozen=True)
class HFConfig:
    values: Mapping[str, JsonValue]

    @classmethod
    def read(cls, path: Path) -> HFConfig:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        text = data.get("text_config")
        return cls(text if isinstance(text, dict) else data)

    def _get(self, key: str, default: JsonValue = None) -> JsonValue:
        value = self.values.get(key)
        return default if value is None else value

    def integer(self, key: str, default: int | None = None) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config.json: {key} must be an integer, got {value!r}")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"config.json: {key} must be a number, got {value!r}")
        return float(value)

    def optional_number(self, key: str) -> float | None:
        return None if self.values.get(key) is None else self.number(key)

    def optional_integer(self, key: str) -> int | None:
        return None if self.values.get(key) is None else self.integer(key)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise ValueError(f"config.json: {key} must be true or false, got {value!r}")
        return value

    def text(self, key: str, default: str | None = None) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise ValueError(f"config.json: {key} must be a string, got {value!r}")
        return value

    def texts(self, key: str) -> list[str] | None:
        value = self.values.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"config.json: {key} must be a list of strings")
        return [str(v) for v in value]

    def section(self, key: str) -> HFConfig:
        value = self.values.get(key)
        return HFConfig(value if isinstance(value, dict) else {})

    def has(self, key: str) -> bool:
        return self.values.get(key) is not None
