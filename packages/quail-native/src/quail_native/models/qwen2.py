"""Qwen2 (Qwen2.5): Qwen3's shape without QK-norm, with biases on the q, k and v projections."""

from __future__ import annotations

from dataclasses import replace

from quail_native.models import qwen3
from quail_native.models.config import HFConfig
from quail_native.models.transformer import Arch


def arch(config: HFConfig) -> Arch:
    """Qwen3's numbers and switches (one RoPE base, SiLU-gated MLP, pre-norm blocks), then Qwen2's two
    differences; its head_dim is always hidden / heads."""
    if config.values.get("use_sliding_window"):
        raise ValueError("Qwen2 with sliding-window layers is not supported")
    hidden, heads = config.integer("hidden_size"), config.integer("num_attention_heads")
    if config.has("head_dim") and config.integer("head_dim") != hidden // heads:
        raise ValueError(f"Qwen2 head_dim {config.integer('head_dim')} is not hidden_size / num_attention_heads")
    return replace(qwen3.arch(config), family="qwen2", qk_norm=False, qkv_bias=True)
