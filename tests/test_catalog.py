"""The built-in catalog: parameter counts match the published architectures."""

from __future__ import annotations

import pytest

from quail.catalog import BUILT_IN_DEVICES, BUILT_IN_MODELS, DeviceSpec, ModelSpec, cpu_device

MODELS = {m.name: m for m in BUILT_IN_MODELS}

# Published counts from the model cards: (total, non-embedding); None where the card gives none.
PUBLISHED = {
    "gemma-3-270m": (268e6, 100e6),
    "qwen3-0.6b": (0.6e9, 0.44e9),
    "qwen3-1.7b": (1.7e9, 1.4e9),
    "qwen3-4b": (4.0e9, 3.6e9),
    "qwen3-4b-fp8": (4.0e9, 3.6e9),
    "qwen3-8b": (8.2e9, 6.95e9),
    "qwen3-32b": (32.8e9, 31.2e9),
    "qwen3-32b-fp8": (32.8e9, 31.2e9),
    # Qwen2.5-Coder cards count one tied embedding; the embedded GGUFs carry their own output matrix (untied)
    "qwen2.5-coder-0.5b-instruct": (0.49e9 + 151_936 * 896, 0.36e9),
    "qwen2.5-coder-1.5b-instruct": (1.54e9 + 151_936 * 1536, 1.31e9),
}


def test_catalog_has_the_embedded_models_and_every_qwen3_size():
    assert set(PUBLISHED) == set(MODELS)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_non_embedding_parameters_match_the_published_count_within_one_percent(name):
    _, non_embedding = PUBLISHED[name]
    assert MODELS[name].non_embedding_params == pytest.approx(non_embedding, rel=0.01)


@pytest.mark.parametrize("name", ["gemma-3-270m", "qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-32b",
                                  "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_total_parameters_match_the_published_count_within_one_percent(name):
    total, _ = PUBLISHED[name]
    assert MODELS[name].params == pytest.approx(total, rel=0.01)


def test_gemma_embedding_is_most_of_its_parameters():
    gemma = MODELS["gemma-3-270m"]
    assert gemma.embedding_params == 262_144 * 640
    assert gemma.sliding_window == 512


def test_fp8_variants_halve_weight_bytes_but_not_the_kv_cache():
    assert MODELS["qwen3-4b-fp8"].weight_bytes_total == pytest.approx(MODELS["qwen3-4b"].weight_bytes_total / 2)
    assert MODELS["qwen3-4b-fp8"].kv_bytes_per_token == MODELS["qwen3-4b"].kv_bytes_per_token


def test_kv_bytes_per_token_is_two_layers_kv_heads_head_dim_bytes():
    qwen = MODELS["qwen3-8b"]
    assert qwen.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2


def test_model_spec_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelSpec(name="odd", architecture="qwen3", layers=1, hidden=8, heads=3, kv_heads=2,
                  head_dim=4, ffn=8, vocab=10, context_length=16)


def test_datasheet_gpus_have_their_published_memory_and_bandwidth():
    devices = {d.name: d for d in BUILT_IN_DEVICES}
    assert {"cpu", "h100-sxm", "h200", "a100-80gb", "l40s"} <= set(devices)
    assert devices["h200"].memory_bytes == pytest.approx(141e9)
    assert devices["h100-sxm"].bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert devices["a100-80gb"].peak_flops("fp8") == devices["a100-80gb"].peak_bf16_flops
    assert devices["l40s"].peak_flops("fp8") > devices["l40s"].peak_flops("bf16")


def test_cpu_device_reads_this_machine_and_accepts_configured_peaks():
    measured = cpu_device()
    assert measured.kind == "cpu" and measured.memory_bytes > 1e9
    configured = cpu_device(peak_bf16_flops=1e12, bandwidth_bytes_per_s=5e10)
    assert configured.peak_flops("bf16") == 1e12
    assert configured.bandwidth_bytes_per_s == 5e10


def test_device_spec_rejects_non_positive_numbers():
    with pytest.raises(ValueError, match="bandwidth"):
        DeviceSpec(name="bad", kind="cuda", memory_bytes=1, peak_bf16_flops=1, peak_fp32_flops=1,
                   bandwidth_bytes_per_s=0)


def test_cpu_peak_comes_from_the_vector_units_of_the_first_processor(tmp_path):
    from quail.catalog.devices import _cpu_flags_and_mhz

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu MHz\t\t: 2000.000\nflags\t\t: fpu avx2 fma\n\n"
                    "processor\t: 1\ncpu MHz\t\t: 3000.000\nflags\t\t: fpu\n")
    flags, mhz = _cpu_flags_and_mhz(info)
    assert {"avx2", "fma"} <= flags and mhz == 2000.0
