"""Where a model's weights come from: a directory, a GGUF file converted once, or a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models

from quail import ModelSpec, RefusalError
from quail_native.models import embedded
from quail_native.models.loading import load_model
from quail_native.models.locate import model_directory


def spec(source: str) -> ModelSpec:
    return ModelSpec(name="tiny", architecture="qwen3", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32,
                     ffn=128, vocab=400, context_length=4096, source=source)


def test_a_local_directory_is_used_as_it_is(tmp_path):
    directory = tiny_models.build("qwen3", tmp_path / "qwen")
    assert model_directory(spec(str(directory))) == directory


def test_a_gguf_file_is_converted_once_into_a_cached_directory(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    monkeypatch.setenv("QUAIL_HOME", str(tmp_path / "home"))
    source = tiny_models.build("qwen3", tmp_path / "source")
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF stand-in: the de-quantizing loader is replaced below")
    calls: list[Path] = []

    def load(path: Path) -> tuple[object, object]:
        calls.append(path)
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(source / "tokenizer.json"))
        return AutoModelForCausalLM.from_pretrained(source), tokenizer

    monkeypatch.setattr(embedded, "_load_from_gguf", load)
    converted = model_directory(spec(str(gguf)))
    assert (converted / "config.json").is_file() and (converted / "tokenizer.json").is_file()
    assert load_model(converted).arch.family == "qwen3"
    assert model_directory(spec(str(gguf))) == converted
    assert calls == [gguf.resolve()]


def test_missing_weights_are_refused_with_how_to_provide_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(RefusalError, match="not on this machine") as caught:
        model_directory(spec("Qwen/Qwen3-8B"))
    assert "never downloads" in str(caught.value)


def test_truncated_weights_are_a_model_file_error_naming_the_file(tmp_path):
    """A weights file cut in half (a full disk, a copy stopped midway) is the user's to fix: named, no
    safetensors traceback."""
    from quail import ModelFileError

    directory = tiny_models.build("qwen3", tmp_path / "qwen")
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelFileError, match=f"the weights file {weights} cannot be read"):
        load_model(directory)


@pytest.mark.parametrize("dtype", ["as stored", "bfloat16"])
def test_weights_read_one_tensor_at_a_time_equal_safetensors_own_reader(tmp_path, dtype):
    """The loader reads each tensor into memory of its own (no mapping of the whole file) and converts it at once;
    every tensor equals what the safetensors library reads, converted the same way."""
    import torch
    from safetensors.torch import load_file

    from quail_native.models.loading import _local_name, read_weights

    directory = tiny_models.build("qwen2", tmp_path / "qwen2")
    target = None if dtype == "as stored" else torch.bfloat16
    mine = read_weights(directory, target)
    theirs = load_file(str(directory / "model.safetensors"))
    assert set(mine) == {_local_name(name) for name in theirs}
    for name, tensor in theirs.items():
        expected = tensor if target is None else tensor.to(target)
        assert mine[_local_name(name)].dtype == expected.dtype
        assert torch.equal(mine[_local_name(name)], expected), name


def _safetensors(header: object, length: int | None = None, tail: bytes = bytes(16)) -> bytes:
    import json
    import struct

    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + tail


@pytest.mark.parametrize(("content", "message"), [
    (b"", "0 bytes: no header"),
    (_safetensors({}, length=1 << 40), "the header claims 1,099,511,627,776 bytes"),
    (_safetensors([1, 2]), "the header is not a JSON object"),
    (_safetensors({"w": 3}), "tensor w has no shape and byte range"),
    (_safetensors({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}),
     "tensor w is of type 'F8_E4M3', which Quail does not read"),
    (_safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 20]}}), "tensor w lies outside"),
    (_safetensors({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 16]}}), "shape"),
])
def test_a_damaged_weights_file_is_a_model_file_error_naming_what(tmp_path, content, message):
    from quail import ModelFileError
    from quail_native.models.loading import read_weights

    directory = tmp_path / "bad"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(content)
    with pytest.raises(ModelFileError, match=message):
        read_weights(directory)
