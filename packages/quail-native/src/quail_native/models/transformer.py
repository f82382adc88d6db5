"""One decoder-only transformer, written for packed prefill over a reused KV cache.

`Arch` holds the numbers and the few switches that tell Qwen3 and Gemma 3 apart (norm style,
post-norms, embedding scale, activation, per-layer RoPE base and sliding window). The forward pass
takes new tokens with explicit positions, the KV they may attend to (the context), and boolean
masks; it returns hidden states only at the rows whose answers are read, and the new KV.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

LayerType = Literal["full", "sliding"]
Activation = Literal["silu", "gelu_tanh"]


class AttentionSegment(Protocol):
    """Rows that attend together: `context` columns of the context KV, then their own rows."""

    rows: slice
    context: torch.Tensor
    masks: dict[LayerType, torch.Tensor]


@dataclass(frozen=True)
class Arch:
    """Architecture numbers (from config.json) and the switches between Qwen3 and Gemma 3."""

    family: Literal["qwen3", "gemma3"]
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    norm_eps: float
    layer_types: tuple[LayerType, ...]
    rope_theta: dict[LayerType, float]
    rope_factor: dict[LayerType, float]
    sliding_window: int | None
    attention_scale: float
    activation: Activation
    tied_embeddings: bool
    embed_scale: float | None
    gemma_norms: bool  # RMSNorm scales by (1 + w) and layers add post-norms

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.layers:
            raise ValueError(f"{len(self.layer_types)} layer types for {self.layers} layers")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, gemma: bool) -> None:
        super().__init__()
        self.eps = eps
        self.gemma = gemma
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In place where the buffer is ours: each pass over [tokens, hidden] costs as much as the arithmetic.
        wide = x.float()
        normed = wide * wide.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        if self.gemma:
            return normed.mul_(1.0 + self.weight.float()).type_as(x)
        return self.weight * normed.to(x.dtype)


def rope_tables(arch: Arch, positions: torch.Tensor, dtype: torch.dtype) -> dict[LayerType, tuple[torch.Tensor, ...]]:
    """cos / sin per layer type for the given token positions: [T, head_dim] each."""
    tables = {}
    for kind in set(arch.layer_types):
        exponents = torch.arange(0, arch.head_dim, 2, dtype=torch.float, device=positions.device) / arch.head_dim
        inverse = 1.0 / (arch.rope_theta[kind] ** exponents) / arch.rope_factor[kind]
        angles = positions[:, None].float() * inverse[None, :]
        cos, sin = angles.cos(), angles.sin()
        tables[kind] = (torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype))
    return tables


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE on [heads, T, head_dim] with tables [T, head_dim] (the half-split convention).

    The sine table carries the rotation's sign (−sin on the first half), so the halves are only
    swapped, not negated: one pass fewer over q and k.
    """
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return (x * cos).addcmul_(swapped, signed_sin)


class Attention(nn.Module):
    def __init__(self, arch: Arch, kind: LayerType) -> None:
        super().__init__()
        self.arch = arch
        self.kind = kind
        self.q_proj = nn.Linear(arch.hidden, arch.heads * arch.head_dim, bias=False)
        self.k_proj = nn.Linear(arch.hidden, arch.kv_heads * arch.head_dim, bias=False)
        self.v_proj = nn.Linear(arch.hidden, arch.kv_heads * arch.head_dim, bias=False)
        self.o_proj = nn.Linear(arch.heads * arch.head_dim, arch.hidden, bias=False)
        self.q_norm = RMSNorm(arch.head_dim, arch.norm_eps, arch.gemma_norms)
        self.k_norm = RMSNorm(arch.head_dim, arch.norm_eps, arch.gemma_norms)
        self.qkv: torch.Tensor | None = None

    def fuse(self) -> None:
        """One [q; k; v] weight, so the three projections are one bigger (faster) GEMM; the three
        parameters become views of it (no extra memory)."""
        self.qkv = _fuse(self.q_proj, self.k_proj, self.v_proj)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = F.linear(x, self.qkv).split([self.q_proj.out_features, self.k_proj.out_features,
                                               self.v_proj.out_features], dim=-1)
        return q, k, v

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...], context: tuple[torch.Tensor, torch.Tensor],
                segments: Sequence[AttentionSegment]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        arch, tokens = self.arch, x.shape[0]
        q, k, v = self.project(x)
        q = self.q_norm(q.reshape(tokens, arch.heads, arch.head_dim)).transpose(0, 1)
        k = self.k_norm(k.reshape(tokens, arch.kv_heads, arch.head_dim)).transpose(0, 1)
        v = v.reshape(tokens, arch.kv_heads, arch.head_dim).transpose(0, 1)
        q, k = rotate(q, *rope), rotate(k, *rope)
        out = torch.empty_like(q)
        for segment in segments:
            rows = segment.rows
            keys = torch.cat((context[0].index_select(1, segment.context), k[:, rows]), dim=1)
            values = torch.cat((context[1].index_select(1, segment.context), v[:, rows]), dim=1)
            out[:, rows] = F.scaled_dot_product_attention(
                q[None, :, rows], keys[None], values[None], attn_mask=segment.masks[self.kind][None, None],
                scale=arch.attention_scale, enable_gqa=arch.heads != arch.kv_heads)[0]
        return self.o_proj(out.transpose(0, 1).reshape(tokens, -1)), k, v


class MLP(nn.Module):
    def __init__(self, arch: Arch) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(arch.hidden, arch.ffn, bias=False)
        self.up_proj = nn.Linear(arch.hidden, arch.ffn, bias=False)
        self.down_proj = nn.Linear(arch.ffn, arch.hidden, bias=False)
        self.activation = arch.activation
        self.gate_up: torch.Tensor | None = None

    def fuse(self) -> None:
        """One [gate; up] weight: one GEMM of twice the width instead of two."""
        self.gate_up = _fuse(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        if self.activation == "silu":
            return self.down_proj(F.silu(gate).mul_(up))
        return self.down_proj(gelu_tanh_times(gate, up))


SIGMOID_LINEAR = 2.0 * math.sqrt(2.0 / math.pi)
SIGMOID_CUBIC = SIGMOID_LINEAR * 0.044715


def gelu_tanh_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GELU-tanh(gate) · up, as gate · σ(2u) with u = √(2/π)(gate + 0.044715 gate³).

    The same function (0.5(1 + tanh u) = σ(2u)), written so that it runs in one buffer: torch's CPU
    tanh is about three times slower than its sigmoid, and F.gelu(…, "tanh") · up was the largest
    elementwise cost of a pass (measured 6.2 → 3.9 ms on [1024, 2048] fp32, 2 threads).
    """
    wide = gate.float()  # bf16 computes in fp32 like F.gelu does inside; fp32 is unchanged (no copy)
    inner = wide * wide
    inner.mul_(SIGMOID_CUBIC).add_(SIGMOID_LINEAR).mul_(wide)
    return inner.sigmoid_().mul_(wide).to(gate.dtype).mul_(up)


def _fuse(*linears: nn.Linear) -> torch.Tensor:
    """Concatenate the weights along the output dimension and make each linear's weight a view into it."""
    fused = torch.cat([linear.weight.detach() for linear in linears])
    offset = 0
    for linear in linears:
        rows = linear.out_features
        linear.weight = nn.Parameter(fused[offset: offset + rows], requires_grad=False)
        offset += rows
    return fused


class Block(nn.Module):
    def __init__(self, arch: Arch, kind: LayerType) -> None:
        super().__init__()
        self.kind = kind
        self.self_attn = Attention(arch, kind)
        self.mlp = MLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden, arch.norm_eps, arch.gemma_norms)
        self.post_attention_layernorm = RMSNorm(arch.hidden, arch.norm_eps, arch.gemma_norms)
        self.gemma = arch.gemma_norms
        if self.gemma:
            self.pre_feedforward_layernorm = RMSNorm(arch.hidden, arch.norm_eps, True)
            self.post_feedforward_layernorm = RMSNorm(arch.hidden, arch.norm_eps, True)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...], context: tuple[torch.Tensor, torch.Tensor],
                segments: Sequence[AttentionSegment]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, k, v = self.self_attn(self.input_layernorm(x), rope, context, segments)
        if self.gemma:
            x = x + self.post_attention_layernorm(attended)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))), k, v
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


@dataclass
class ForwardOutput:
    hidden: torch.Tensor  # [readout rows, hidden], after the final norm
    keys: list[torch.Tensor]  # per layer [kv_heads, T, head_dim]
    values: list[torch.Tensor]


class Transformer(nn.Module):
    def __init__(self, arch: Arch) -> None:
        super().__init__()
        self.arch = arch
        # An explicit (uninitialised) weight: the loaded one replaces it, and drawing 168M random numbers —
        # or, on the meta device, the first normal_ — would cost a second of start-up for nothing.
        self.embed_tokens = nn.Embedding(arch.vocab, arch.hidden, _weight=torch.empty(arch.vocab, arch.hidden))
        self.layers = nn.ModuleList(Block(arch, kind) for kind in arch.layer_types)
        self.norm = RMSNorm(arch.hidden, arch.norm_eps, arch.gemma_norms)
        self.lm_head = None if arch.tied_embeddings else nn.Linear(arch.hidden, arch.vocab, bias=False)

    def fuse_projections(self) -> None:
        """Fewer, wider GEMMs per layer (q/k/v and gate/up); call once the weights are loaded."""
        for block in self.layers:
            block.self_attn.fuse()
            block.mlp.fuse()

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        if self.arch.embed_scale is not None:
            x = x * torch.tensor(self.arch.embed_scale, dtype=x.dtype)
        return x

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, context: list[tuple[torch.Tensor, torch.Tensor]],
                segments: Sequence[AttentionSegment], readout: torch.Tensor) -> ForwardOutput:
        """Prefill `tokens` at `positions`; each segment of rows attends to its columns of each layer's
        `context` KV and to its own rows under its masks; hidden states only at `readout` rows."""
        x = self.embed(tokens)
        tables = rope_tables(self.arch, positions, x.dtype)
        keys, values = [], []
        for index, block in enumerate(self.layers):
            x, k, v = block(x, tables[block.kind], context[index], segments)
            keys.append(k)
            values.append(v)
        return ForwardOutput(self.norm(x[readout]), keys, values)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """Head logits at readout rows: only the given vocabulary `columns` when named."""
        weight = self.head_weight if columns is None else self.head_weight[columns]
        return hidden.float() @ weight.float().T

