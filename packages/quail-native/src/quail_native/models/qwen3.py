"""Qwen3: pre-norm blocks, QK-norm, one RoPE base, SiLU-gated MLP, optional tied head."""

from __future__ import annotations

from quail_native.models.config import HFConfig
from quail_native.models.transformer import Arch


def rope_theta(config: HFConfig) -> float:
    for key in ("rope_parameters", "rope_scaling"):
        section = config.section(key)
        if section.has("rope_theta"):
            return section.number("rope_theta")
    return config.number("rope_theta", 10000.0)


def arch(config: HFConfig) -> Arch:
    if config.values.get("use_sliding_window"):
        raise ValueError("Qwen3 with sliding-window layers is not supported")
    if config.text("hidden_act", "silu") != "silu":
        raise ValueError(f"unexpected Qwen3 activation {config.text('hidden_act')!r}")
    layers, heads, hidden = config.integer("num_hidden_layers"), config.integer("num_attention_heads"), \
        config.integer("hidden_size")
    head_dim = config.integer("head_dim", hidden // heads)
    return Arch(
        family="qwen3", vocab=config.integer("vocab_size"), hidden=hidden, layers=layers, heads=heads,
        kv_heads=config.integer("num_key_value_heads", heads), head_dim=head_dim,
        ffn=config.integer("intermediate_size"), norm_eps=config.number("rms_norm_eps", 1e-6),
        layer_types=("full",) * layers, rope_theta={"full": rope_theta(config)}, rope_factor={"full": 1.0},
        sliding_window=None, attention_scale=head_dim ** -0.5, activation="silu",
        tied_embeddings=config.flag("tie_word_embeddings", True), embed_scale=None, gemma_norms=False,
    )
