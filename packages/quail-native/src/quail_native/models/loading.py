"""Load a model directory (config.json + safetensors + tokenizer.json) into our Transformer."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from quail.extend import HuggingFaceTokenizer
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


def read_weights(path: Path, dtype: torch.dtype | None = None,
                 device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files by its local name, converted to `dtype` on `device`
    one tensor at a time as it is read: a float32 checkpoint loaded in bf16 never holds the float32 weights whole
    (for the 1.5B model 6.2 GB more at the peak — a memory-mapped read counts every page it touched)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no .safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            for name, tensor in file_tensors(file):
                if dtype is not None or device is not None:
                    tensor = tensor.to(device=device, dtype=dtype)
                weights[_local_name(name)] = tensor
        except (OSError, ValueError, RuntimeError) as error:  # RuntimeError: a shape its bytes do not fill
            raise ModelLoadError(f"the weights file {file} cannot be read ({type(error).__name__}: {error}); it is "
                                 "damaged or truncated: restore it, or delete the directory to convert it "
                                 "again") from None
    return weights


SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}


def file_tensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of one safetensors file, each read into memory of its own (not mapped): its 8-byte header
    length, JSON header (dtype, shape, byte range of every tensor), then the bytes. Raises ValueError naming
    what does not hold."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        if size < 8:
            raise ValueError(f"{size} bytes: no header")
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > size - 8:
            raise ValueError(f"the header claims {length:,} bytes; the file has {size - 8:,} after its length")
        header = json.loads(handle.read(length))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        base = 8 + length
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            yield name, _tensor(handle, name, entry, base, size)


def _tensor(handle: BinaryIO, name: str, entry: object, base: int, size: int) -> torch.Tensor:
    if not isinstance(entry, dict) or not isinstance(entry.get("data_offsets"), list) \
            or not isinstance(entry.get("shape"), list):
        raise ValueError(f"tensor {name} has no shape and byte range")
    dtype = SAFETENSORS_DTYPES.get(str(entry.get("dtype")))
    if dtype is None:
        raise ValueError(f"tensor {name} is of type {entry.get('dtype')!r}, which Quail does not read "
                         f"({', '.join(SAFETENSORS_DTYPES)})")
    start, stop = entry["data_offsets"]
    if not 0 <= start <= stop or base + stop > size:
        raise ValueError(f"tensor {name} lies outside the file")
    handle.seek(base + start)
    data = bytearray(stop - start)
    if handle.readinto(data) != len(data):
        raise ValueError(f"tensor {name} is cut short")
    flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return flat.reshape(entry["shape"])


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
    target = torch.device(device)
    weights = read_weights(path, dtype, target)
    if arch.tied_embeddings:
        weights.pop("lm_head.weight", None)
    expected = set(model.state_dict())
    missing, unexpected = expected - set(weights), set(weights) - expected
    if missing:
        raise ModelLoadError(f"{path}: weights missing for {sorted(missing)[:5]}")
    if unexpected - {"lm_head.weight"}:
        raise ModelLoadError(f"{path}: unexpected weights {sorted(unexpected)[:5]}")
    model.load_state_dict({k: v for k, v in weights.items() if k in expected}, assign=True)
    del weights
    model.eval()
    model.requires_grad_(False)
    model.fuse_projections()
    return LoadedModel(path, arch, model, load_tokenizer(path), dtype, target)
