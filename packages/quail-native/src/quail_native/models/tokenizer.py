"""A checkpoint's tokenizer and model family, read without torch.

Planning needs the tokenizer, not the model: reading it here keeps torch (seconds to import on a slow
machine) out of planning. Planning still imports it where it needs a measurement: with the answer
store on, `precision="auto"` on a CPU whose probe is not remembered yet (`precision_record`) runs the
GEMM probe that is part of the store's model identity.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from quail import ModelFileError
from quail.extend import HuggingFaceTokenizer
from quail_native.models.config import HFConfig

Family = Literal["qwen2", "qwen3", "gemma3"]
FAMILIES: dict[str, Family] = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "gemma3": "gemma3"}


class ModelLoadError(ModelFileError):
    """The directory does not hold a model this executor can run (a user error naming the file)."""


def read_config(path: Path) -> tuple[HFConfig, Family]:
    """The checkpoint's config.json and the family it names; ModelLoadError for any other."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{path} has no config.json")
    config = HFConfig.read(config_path)
    family = FAMILIES.get(config.text("model_type", ""))
    if family is None:
        raise ModelLoadError(f"{path}: model_type {config.text('model_type', '?')!r} is not Qwen2, Qwen3 or Gemma 3")
    return config, family


def load_tokenizer(path: Path) -> HuggingFaceTokenizer:
    """The checkpoint's tokenizer, made once per process and file version as planning and the engine both
    need it; its file is parsed on first use (Gemma's 262k-entry file takes seconds on a slow CPU), which a
    query whose texts' ids are all remembered never makes."""
    tokenizer_path = path / "tokenizer.json"
    stat = tokenizer_path.stat() if tokenizer_path.is_file() else None
    return _tokenizer(path, None if stat is None else (stat.st_size, stat.st_mtime_ns))


@lru_cache(maxsize=8)
def _tokenizer(path: Path, _version: tuple[int, int] | None) -> HuggingFaceTokenizer:
    config, family = read_config(path)
    if _version is None:
        raise ModelLoadError(f"{path} has no tokenizer.json")
    bos = config.optional_integer("bos_token_id") if family == "gemma3" else None
    return HuggingFaceTokenizer(path / "tokenizer.json", bos)
