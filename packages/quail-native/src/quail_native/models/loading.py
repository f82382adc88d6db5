"""Load a model directory (config.json + safetensors + tokenizer.json) into our Transformer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from quail.data.tokenizer import HuggingFaceTokenizer
from quail_native.models import gemma3, qwen2, qwen3
from quail_native.models.tokenizer import ModelLoadError, load_tokenizer, read_config
from quail_native.models.transformer import Arch, Transformer

PREFIXES = ("language_model.model.", "model.language_model.", "model.")


@dataclass
class LoadedModel:
    path: Path
    arch: Arch
    model: Transformer
    tokenizer: HuggingFaceTokenizer
    dtype: torch.dtype
    device: torch.device


def read_arch(path: Path) -> Arch:
    config, family = read_config(path)
    return {"qwen2": qwen2.arch, "qwen3": qwen3.arch, "gemma3": gemma3.arch}[family](config)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no .safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors = load_file(str(file))
        except Exception as error:  # safetensors' own SafetensorError for a truncated or damaged file
            raise ModelLoadError(f"the weights file {file} cannot be read ({type(error).__name__}: {error}); it is "
                                 "damaged or truncated: restore it, or delete the directory to convert it "
                                 "again") from None
        for name, tensor in tensors.items():
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
    return LoadedModel(path, arch, model, load_tokenizer(path), dtype, target)
