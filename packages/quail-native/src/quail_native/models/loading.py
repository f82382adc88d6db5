"""Load a model directory (config.json + safetensors + tokenizer.json) into our Transformer."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from safetensors.torch import load_file

from quail.data.tokenizer import HuggingFaceTokenizer
from quail_native.models import gemma3, qwen3
from quail_native.models.config import HFConfig
from quail_native.models.transformer import Arch, Transformer

PREFIXES = ("language_model.model.", "model.language_model.", "model.")
FAMILIES = {"qwen3": "qwen3", "gemma3_text": "gemma3", "gemma3": "gemma3"}


class ModelLoadError(ValueError):
    """The directory does not hold a model this executor can run."""


@dataclass
class LoadedModel:
    path: Path
    arch: Arch
    model: Transformer
    tokenizer: HuggingFaceTokenizer
    dtype: torch.dtype
    device: torch.device


def read_arch(path: Path) -> Arch:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{path} has no config.json")
    config = HFConfig.read(config_path)
    family = FAMILIES.get(config.text("model_type", ""))
    if family is None:
        raise ModelLoadError(f"{path}: model_type {config.text('model_type', '?')!r} is not Qwen3 or Gemma 3")
    return qwen3.arch(config) if family == "qwen3" else gemma3.arch(config)


def load_tokenizer(path: Path, arch: Arch) -> HuggingFaceTokenizer:
    """The checkpoint's tokenizer; parsed once per process (Gemma's 262k-entry file takes most of a second),
    as planning and the engine both need it."""
    tokenizer_path = path / "tokenizer.json"
    stat = tokenizer_path.stat() if tokenizer_path.is_file() else None
    return _tokenizer(path, arch.family, None if stat is None else (stat.st_size, stat.st_mtime_ns))


@lru_cache(maxsize=8)
def _tokenizer(path: Path, family: str, _version: tuple[int, int] | None) -> HuggingFaceTokenizer:
    tokenizer_path = path / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise ModelLoadError(f"{path} has no tokenizer.json")
    config = HFConfig.read(path / "config.json")
    bos = config.optional_integer("bos_token_id") if family == "gemma3" else None
    return HuggingFaceTokenizer(tokenizer_path, bos)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no .safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            weights[_local_name(name)] = tensor
    return weights


def _local_name(name: str) -> str:
    if name.startswith("lm_head."):
        return name
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def load_model(path: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> LoadedModel:
    arch = read_arch(path)
    with torch.device("meta"):
        model = Transformer(arch)
    weights = read_weights(path)
    if arch.tied_embeddings:
        weights.pop("lm_head.weight", None)
    expected = set(model.state_dict())
    missing, unexpected = expected - set(weights), set(weights) - expected
    if missing:
        raise ModelLoadError(f"{path}: weights missing for {sorted(missing)[:5]}")
    if unexpected - {"lm_head.weight"}:
        raise ModelLoadError(f"{path}: unexpected weights {sorted(unexpected)[:5]}")
    target = torch.device(device)
    state = {k: v.to(device=target, dtype=dtype) for k, v in weights.items() if k in expected}
    model.load_state_dict(state, assign=True)
    model.eval()
    model.requires_grad_(False)
    model.fuse_projections()
    return LoadedModel(path, arch, model, load_tokenizer(path, arch), dtype, target)
