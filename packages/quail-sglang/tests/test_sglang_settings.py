"""What the sglang backend asks of the machine and of SGLang, checked without booting an engine."""

from __future__ import annotations

import json
import sys

import pytest

import quail
from quail.extend import GpuContext
from quail_sglang import backend as sglang_backend
from quail_sglang.backend import INSTALL, SGLangBackend, boot_sglang, settings_for


@pytest.fixture
def model(tmp_path) -> quail.ModelSpec:
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 2}))
    return quail.ModelSpec(name="tiny", architecture="qwen3", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32,
                           ffn=128, vocab=400, context_length=4096, source=str(tmp_path))


def device(name: str) -> quail.DeviceSpec:
    return quail.ExtensionRegistry.with_built_ins().device(name)


def context(model: quail.ModelSpec, name: str, **config: object) -> GpuContext:
    return GpuContext(model, device(name), 0, 1, quail.EngineConfig(**config))  # type: ignore[arg-type]


def test_fp32_settings_turn_the_kv_budget_into_a_token_pool_of_that_dtype(model):
    settings = settings_for(context(model, "h100-sxm", precision="fp32", chunk_tokens=512, kv_budget_bytes=1 << 20))
    per_token = 2 * 2 * 2 * 32 * 4  # K and V × layers × kv heads × head dim × fp32 bytes
    assert settings.dtype == "float32" and settings.kv_tokens == (1 << 20) // per_token
    assert settings.context_length == 512 + 7 and str(settings.model_dir) == model.source


def test_default_settings_are_bf16_with_the_pool_left_to_sglang(model):
    settings = settings_for(context(model, "h100-sxm"))
    assert settings.dtype == "bfloat16" and settings.kv_tokens is None
    assert settings.server_args()["disable_radix_cache"] is False


def test_a_cpu_device_is_refused_because_sglang_needs_a_cuda_gpu(model):
    verdict = SGLangBackend().supports(model, device("cpu"), 1)
    assert not verdict.accepted and "CUDA GPU" in (verdict.reason or "")


def test_more_than_one_gpu_is_refused(model):
    verdict = SGLangBackend().supports(model, device("h100-sxm"), 2)
    assert not verdict.accepted and "exactly one GPU" in (verdict.reason or "")


def test_a_missing_engine_is_named_with_its_install_command(model, monkeypatch):
    monkeypatch.setattr(sglang_backend, "installed", lambda distribution: False)
    verdict = SGLangBackend().supports(model, device("h100-sxm"), 1)
    assert not verdict.accepted and f"(sglang) is not installed: {INSTALL}" in (verdict.reason or "")


def test_first_use_without_an_importable_sglang_is_refused_with_the_install_command(model, monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # makes `import sglang` raise ImportError
    with pytest.raises(quail.RefusalError, match="SGLang cannot be imported") as refused:
        boot_sglang(context(model, "h100-sxm"))
    assert INSTALL in str(refused.value)


def test_an_unwired_architecture_is_refused(model):
    other = quail.ModelSpec(name="x", architecture="llama", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32,
                            ffn=128, vocab=400, context_length=4096, source=model.source)
    verdict = SGLangBackend().supports(other, device("h100-sxm"), 1)
    assert not verdict.accepted and "llama" in (verdict.reason or "")
