"""Gemma 3: (1 + w) RMSNorms before and after attention and MLP, QK-norm, scaled embeddings,
GELU-tanh gated MLP, local sliding-window layers with their own RoPE base between global ones."""

from __future__ import annotations

import math

from quail_native.models.config import HFConfig
from quail_native.models.transformer import Arch, LayerType

HF_LAYER_TYPES: dict[str, LayerType] = {"sliding_attention": "sliding", "full_attention": "full"}


def layer_types(config: HFConfig, layers: int) -> tuple[LayerType, ...]:
    named = config.texts("layer_types")
    if named is not None:
        return tuple(HF_LAYER_TYPES[name] for name in named[:layers])
    every = config.integer("sliding_window_pattern", 6)
    return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(layers))


def rope(config: HFConfig) -> tuple[dict[LayerType, float], dict[LayerType, float]]:
    """RoPE base and linear scaling factor per layer type, from either config layout."""
    parameters = config.section("rope_parameters")
    thetas: dict[LayerType, float] = {}
    factors: dict[LayerType, float] = {}
    for hf_name, kind in HF_LAYER_TYPES.items():
        section = parameters.section(hf_name)
        if section.has("rope_theta"):
            thetas[kind] = section.number("rope_theta")
            rope_type = section.text("rope_type", "default")
            if rope_type not in ("default", "linear"):
                raise ValueError(f"unsupported Gemma 3 RoPE type {rope_type!r}")
            factors[kind] = section.number("factor", 1.0) if rope_type == "linear" else 1.0
    if not thetas:
        thetas = {"full": config.number("rope_theta", 1_000_000.0),
                  "sliding": config.number("rope_local_base_freq", 10_000.0)}
        scaling = config.section("rope_scaling")
        factors = {"full": scaling.number("factor", 1.0) if scaling.has("factor") else 1.0, "sliding": 1.0}
    return thetas, factors


def arch(config: HFConfig) -> Arch:
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.optional_number(key) is not None:
            raise ValueError(f"Gemma 3 with {key} is not supported")
    if config.text("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"unexpected Gemma 3 activation {config.text('hidden_activation')!r}")
    layers, heads, hidden = config.integer("num_hidden_layers"), config.integer("num_attention_heads"), \
        config.integer("hidden_size")
    head_dim = config.integer("head_dim", hidden // heads)
    thetas, factors = rope(config)
    return Arch(
        family="gemma3", vocab=config.integer("vocab_size"), hidden=hidden, layers=layers, heads=heads,
        kv_heads=config.integer("num_key_value_heads", heads), head_dim=head_dim,
        ffn=config.integer("intermediate_size"), norm_eps=config.number("rms_norm_eps", 1e-6),
        layer_types=layer_types(config, layers), rope_theta=thetas, rope_factor=factors,
        sliding_window=config.optional_integer("sliding_window"),
        attention_scale=config.number("query_pre_attn_scalar", head_dim) ** -0.5, activation="gelu_tanh",
        tied_embeddings=config.flag("tie_word_embeddings", True), embed_scale=math.sqrt(hidden), gemma_norms=True,
    )
