"""One decoder-only transformer, written for packed prefill over a reused KV cache.

`Arch` holds the numbers and the few switches that tell Qwen3 and Gemma 3 apart (norm style,
post-norms, embedding scale, activation, per-layer RoPE base and sliding window). The forward pass
takes new tokens with explicit positions, the KV they may attend to (the context), and boolean
masks; it returns hidden states only at the rows whose answers are read, and the new KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from quail_native.models import kernels
from quail_native.models.projection import Projection
from quail_native.models.tokenizer import Family

LayerType = Literal["full", "sliding"]
Activation = Literal["silu", "gelu_tanh"]


class AttentionSegment(Protocol):
    """Rows that attend together: `context` columns of the context KV, then their own rows."""

    rows: slice
    context: torch.Tensor
    masks: dict[LayerType, torch.Tensor]


class AttentionLayout(Protocol):
    """A pass's segments (in pass order, covering its rows), and the same laid out flat for one attention call
    over all of them: `flat` (checked once for every layer; None where the fused kernel cannot read it) and per
    layer kind each segment's mask flattened, one after the other, in `masks` (see `kernels.attention`)."""

    @property
    def segments(self) -> Sequence[AttentionSegment]: ...

    @property
    def flat(self) -> kernels.FlatSegments | None: ...

    @property
    def masks(self) -> dict[LayerType, torch.Tensor]: ...


@dataclass(frozen=True)
class WrittenRows:
    """Rows of a pass whose k and v each layer writes into the context KV (at `slots`) before it attends: the
    other rows of the pass then read them as context, like KV an earlier pass left there."""

    rows: torch.Tensor  # long [n], rows of the pass
    slots: torch.Tensor  # long [n], rows of each layer's context KV


@dataclass(frozen=True)
class Arch:
    """Architecture numbers (from config.json) and the switches between Qwen2, Qwen3 and Gemma 3."""

    family: Family
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
    qk_norm: bool = True  # q and k heads are RMS-normalised before RoPE (Qwen3, Gemma 3; not Qwen2)
    qkv_bias: bool = False  # q, k and v projections add a bias (Qwen2)

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.layers:
            raise ValueError(f"{len(self.layer_types)} layer types for {self.layers} layers")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, gemma: bool) -> None:
        super().__init__()
        self.eps = eps
        self.gemma = gemma
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """norm(x), plus `residual` when given (one pass for both where the fused kernels run)."""
        return kernels.rms_norm(x, self.weight, self.eps, self.gemma, residual)

    def rotated(self, heads: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                scale: float = 1.0) -> torch.Tensor:
        """norm, then RoPE, of [tokens, heads, head_dim] q or k heads with [tokens, head_dim] tables, times
        `scale` (the attention scale, for queries)."""
        return kernels.rms_norm_rope(heads, self.weight, self.eps, self.gemma, cos, signed_sin, scale)


def rope_tables(arch: Arch, positions: torch.Tensor, dtype: torch.dtype) -> dict[LayerType, tuple[torch.Tensor, ...]]:
    """cos / sin per layer type for the given token positions: [T, head_dim] each (see `RopeTables`)."""
    tables = {}
    for kind in set(arch.layer_types):
        exponents = torch.arange(0, arch.head_dim, 2, dtype=torch.float, device=positions.device) / arch.head_dim
        inverse = 1.0 / (arch.rope_theta[kind] ** exponents) / arch.rope_factor[kind]
        angles = positions[:, None].float() * inverse[None, :]
        cos, sin = angles.cos(), angles.sin()
        tables[kind] = (torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype))
    return tables


ROPE_TABLE_POSITIONS = 8192
"""Positions the kept table may cover: 4 KiB a position for Gemma 3 (both layer kinds' cos and sin, head_dim
256, fp32), so at most 32 MiB. A pass reaching further computes its tables (3.4 ms per 1,024 tokens)."""


class RopeTables:
    """`rope_tables` rows for positions 0 … n−1, computed once per dtype and gathered for each pass.

    Computing a pass's tables took 3.4 ms for 1,024 tokens (the cosines and sines of both layer kinds); gathering
    the same rows takes 0.5. The rows are bit-identical: each is the same fp32 angle through the same
    vectorised cos and sin. The table grows to the next power of two past the furthest position asked for, up to
    ROPE_TABLE_POSITIONS."""

    def __init__(self, arch: Arch) -> None:
        self.arch = arch
        self._tables: dict[torch.dtype, dict[LayerType, tuple[torch.Tensor, ...]]] = {}

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[LayerType, tuple[torch.Tensor, ...]]:
        if positions.numel() == 0:
            return rope_tables(self.arch, positions, dtype)
        nearest, furthest = (int(end) for end in torch.aminmax(positions))
        if nearest < 0 or furthest >= ROPE_TABLE_POSITIONS:  # not rows of the table: computed as they are
            return rope_tables(self.arch, positions, dtype)
        tables = self._tables.get(dtype)
        if tables is None or _table_rows(tables) <= furthest or _table_device(tables) != positions.device:
            size = 1 << furthest.bit_length()  # > furthest
            tables = rope_tables(self.arch, torch.arange(size, device=positions.device), dtype)
            self._tables[dtype] = tables
        return {kind: tuple(table[positions] for table in pair) for kind, pair in tables.items()}


def _table_rows(tables: dict[LayerType, tuple[torch.Tensor, ...]]) -> int:
    return next(iter(tables.values()))[0].shape[0]


def _table_device(tables: dict[LayerType, tuple[torch.Tensor, ...]]) -> torch.device:
    return next(iter(tables.values()))[0].device


class Attention(nn.Module):
    def __init__(self, arch: Arch, kind: LayerType) -> None:
        super().__init__()
        self.arch = arch
        self.kind = kind
        self.q_proj = nn.Linear(arch.hidden, arch.heads * arch.head_dim, bias=arch.qkv_bias)
        self.k_proj = nn.Linear(arch.hidden, arch.kv_heads * arch.head_dim, bias=arch.qkv_bias)
        self.v_proj = nn.Linear(arch.hidden, arch.kv_heads * arch.head_dim, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(arch.heads * arch.head_dim, arch.hidden, bias=False)
        self.q_norm = RMSNorm(arch.head_dim, arch.norm_eps, arch.gemma_norms) if arch.qk_norm else None
        self.k_norm = RMSNorm(arch.head_dim, arch.norm_eps, arch.gemma_norms) if arch.qk_norm else None
        self.fused: _AttentionProjections | None = None

    def fuse(self) -> None:
        """One [q; k; v] weight, so the three projections are one bigger (faster) GEMM; the three
        parameters become views of it (no extra memory). The q and [k; v] parts get their own
        projections for the last layer, where only the read-out rows ask."""
        qkv = _fuse(self.q_proj, self.k_proj, self.v_proj)
        bias = _fuse(self.q_proj, self.k_proj, self.v_proj, part="bias") if self.arch.qkv_bias else None
        queries = self.q_proj.out_features
        self.fused = _AttentionProjections(
            Projection(qkv, bias), Projection(qkv[:queries], None if bias is None else bias[:queries]),
            Projection(qkv[queries:], None if bias is None else bias[queries:]), Projection(self.o_proj.weight))

    def project(self, x: torch.Tensor, queries: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (at the `queries` rows when named, else every row), k and v (every row)."""
        fused = _fused(self.fused)
        sizes = [self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features]
        if queries is None:
            q, k, v = fused.qkv(x).split(sizes, dim=-1)
            return q, k, v
        k, v = fused.kv(x).split(sizes[1:], dim=-1)
        return fused.q(x[queries]), k, v

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...], context: tuple[torch.Tensor, torch.Tensor],
                layout: AttentionLayout, queries: torch.Tensor | None = None,
                written: WrittenRows | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention output ([query rows, hidden], after o_proj) and every row's new k and v
        ([kv_heads, rows, head_dim]).

        With `queries`, only those rows ask (the last layer, where only the read-out rows go on), while
        every row still gives its k and v to the cache; the `written` rows' k and v go into the context
        first."""
        arch, tokens = self.arch, x.shape[0]
        q, k, v = self.project(x, queries)
        query_rope = rope if queries is None else tuple(table[queries] for table in rope)
        q = _positioned(self.q_norm, q.reshape(q.shape[0], arch.heads, arch.head_dim), query_rope,
                        arch.attention_scale)
        k = _positioned(self.k_norm, k.reshape(tokens, arch.kv_heads, arch.head_dim), rope, 1.0)
        v = v.reshape(tokens, arch.kv_heads, arch.head_dim)
        if written is not None:
            context[0].index_copy_(1, written.slots, k[written.rows].transpose(0, 1))
            context[1].index_copy_(1, written.slots, v[written.rows].transpose(0, 1))
        out = torch.empty_like(q)
        if not kernels.attention(q, out, queries, context, k, v, layout.flat, layout.masks[self.kind]):
            for segment in layout.segments:
                _attend_segment(q, out, queries, context, segment, k, v, segment.masks[self.kind])
        attended = _fused(self.fused).o(out.reshape(q.shape[0], arch.heads * arch.head_dim))
        return attended, k.transpose(0, 1), v.transpose(0, 1)


def _positioned(norm: RMSNorm | None, heads: torch.Tensor, rope: tuple[torch.Tensor, ...],
                scale: float) -> torch.Tensor:
    """[tokens, heads, head_dim] q or k heads at their positions: QK-norm (where the model has it), RoPE, times
    `scale` (the attention scale, for queries). Without QK-norm the scale multiplies the rotated heads: RoPE
    is linear, and the rotation's own output buffer takes it in place."""
    if norm is not None:
        return norm.rotated(heads, rope[0], rope[1], scale)
    rotated = kernels.rotate(heads, rope[0][:, None], rope[1][:, None])
    return rotated if scale == 1.0 else rotated.mul_(scale)


def _attend_segment(q: torch.Tensor, out: torch.Tensor, queries: torch.Tensor | None,
                    context: tuple[torch.Tensor, torch.Tensor], segment: AttentionSegment, k: torch.Tensor,
                    v: torch.Tensor, mask: torch.Tensor) -> None:
    """Where the fused kernel does not run: the attention of one segment's query rows of q ([queries, heads,
    head_dim]; query i is pass row queries[i], or row i when None) into the same rows of `out`, under `mask`,
    over the segment's context slots and its own rows of the pass's [tokens, kv_heads, head_dim] k and v — two
    GEMMs around a softmax, blocked causally (`attend`) when the queries are all the segment's rows, in order;
    read-out rows alone take one dense block."""
    own_keys, own_values = k[segment.rows], v[segment.rows]
    keys, values = _segment_kv(segment, context, own_keys.transpose(0, 1), own_values.transpose(0, 1))
    if queries is None:
        out[segment.rows] = attend(q[segment.rows].transpose(0, 1), keys, values, mask).transpose(0, 1)
        return
    start, stop = segment.rows.start, segment.rows.stop
    inside = ((queries >= start) & (queries < stop)).nonzero().squeeze(1)
    if inside.numel():
        asked = _attend_block(q[inside].transpose(0, 1), keys, values, mask[queries[inside] - start])
        out[inside] = asked.transpose(0, 1)


def _segment_kv(segment: AttentionSegment, context: tuple[torch.Tensor, torch.Tensor], own_keys: torch.Tensor,
                own_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The [kv_heads, columns, head_dim] keys and values a segment's rows see: its context columns, then its
    own rows (given [kv_heads, rows, head_dim])."""
    keys = torch.cat((context[0].index_select(1, segment.context), own_keys), dim=1)
    values = torch.cat((context[1].index_select(1, segment.context), own_values), dim=1)
    return keys, values


ATTENTION_BLOCK = 256
"""Query rows per attention call when a segment is longer."""


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked attention of [heads, rows, dim] queries (already scaled) over [kv_heads, context + rows, dim]
    keys and values.

    A segment's own rows are causal, so a block of query rows needs the keys only up to its last row:
    blocks of ATTENTION_BLOCK rows skip the masked upper triangle that one dense call would compute
    (a 663-row lender: 11.8 → 5.0 ms per layer in bf16 on a 2-core CPU).
    """
    rows = q.shape[1]
    context = keys.shape[1] - rows
    if rows <= ATTENTION_BLOCK:
        return _attend_block(q, keys, values, mask)
    out = torch.empty_like(q)
    for start in range(0, rows, ATTENTION_BLOCK):
        stop = min(rows, start + ATTENTION_BLOCK)
        reach = context + stop
        out[:, start:stop] = _attend_block(q[:, start:stop], keys[:, :reach], values[:, :reach],
                                           mask[start:stop, :reach])
    return out


def _attend_block(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """On a CPU two batched GEMMs around the softmax, with the query heads that share a KV head stacked
    into one GEMM: torch's CPU flash kernel measured 1.5–2.4× slower on these shapes in bf16 (equal in
    fp32). The softmax reads the scores in the GEMM's dtype: a bf16 softmax computes in fp32 inside and
    rounds its output once (within an ulp of an fp32 softmax and a cast, without fp32 copies of the
    scores: a [4, 256, 1400] block 8.5 → 3.0 ms). Elsewhere torch's fused kernel. The queries carry the scale."""
    heads, rows, dim = q.shape
    kv_heads, columns = keys.shape[0], keys.shape[1]
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask[None, None],
                                              scale=1.0, enable_gqa=heads != kv_heads)[0]
    grouped = q.reshape(kv_heads, heads // kv_heads * rows, dim)
    scores = torch.bmm(grouped, keys.transpose(1, 2)).view(heads, rows, columns)
    weights = scores.masked_fill_(~mask, float("-inf")).softmax(dim=-1)
    return torch.bmm(weights.view(kv_heads, -1, columns), values).view(heads, rows, dim)


@dataclass(frozen=True)
class _AttentionProjections:
    qkv: Projection
    q: Projection
    kv: Projection
    o: Projection


@dataclass(frozen=True)
class _MLPProjections:
    gate_up: Projection
    down: Projection


Fused = TypeVar("Fused", _AttentionProjections, _MLPProjections)


def _fused(projections: Fused | None) -> Fused:
    if projections is None:
        raise RuntimeError("the model's projections are not fused yet: call fuse_projections() once the weights "
                           "are loaded")
    return projections


class MLP(nn.Module):
    def __init__(self, arch: Arch) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(arch.hidden, arch.ffn, bias=False)
        self.up_proj = nn.Linear(arch.hidden, arch.ffn, bias=False)
        self.down_proj = nn.Linear(arch.ffn, arch.hidden, bias=False)
        self.activation = arch.activation
        self.fused: _MLPProjections | None = None

    def fuse(self) -> None:
        """One [gate; up] weight: one GEMM of twice the width instead of two."""
        self.fused = _MLPProjections(Projection(_fuse(self.gate_proj, self.up_proj)), Projection(self.down_proj.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = _fused(self.fused)
        gate, up = fused.gate_up(x).chunk(2, dim=-1)
        if self.activation == "silu":
            return fused.down(kernels.silu_times(gate, up))
        return fused.down(kernels.gelu_tanh_times(gate, up))


def _fuse(*linears: nn.Linear, part: str = "weight") -> torch.Tensor:
    """Concatenate the linears' `part` ("weight" or "bias") along the output dimension and make each linear's one
    a view into it."""
    fused = torch.cat([getattr(linear, part).detach() for linear in linears])
    offset = 0
    for linear in linears:
        rows = linear.out_features
        setattr(linear, part, nn.Parameter(fused[offset: offset + rows], requires_grad=False))
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

    def decode_weights(self) -> kernels.DecodeLayerWeights:
        """This layer as the one-row decode kernel reads it (after `fuse`)."""
        attention, mlp, gemma = _fused(self.self_attn.fused), _fused(self.mlp.fused), self.gemma
        q_norm, k_norm = self.self_attn.q_norm, self.self_attn.k_norm
        scale = self.self_attn.arch.attention_scale
        return kernels.DecodeLayerWeights(
            attention.qkv.weight, attention.qkv.bias, attention.o.weight, mlp.gate_up.weight, mlp.down.weight,
            kernels.applied_norm(self.input_layernorm.weight, gemma),
            kernels.applied_norm(self.post_attention_layernorm.weight, gemma),
            kernels.applied_norm(self.pre_feedforward_layernorm.weight, gemma) if gemma else None,
            kernels.applied_norm(self.post_feedforward_layernorm.weight, gemma) if gemma else None,
            None if q_norm is None else kernels.applied_norm(q_norm.weight, q_norm.gemma, scale),
            None if k_norm is None else kernels.applied_norm(k_norm.weight, k_norm.gemma), self.kind == "sliding")

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...], context: tuple[torch.Tensor, torch.Tensor],
                layout: AttentionLayout, keep: torch.Tensor | None = None,
                written: WrittenRows | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's output rows (only the `keep` rows when named) and every row's new k and v."""
        attended, k, v = self.self_attn(self.input_layernorm(x), rope, context, layout, keep, written)
        if keep is not None:
            x = x[keep]
        if self.gemma:
            x = self.post_attention_layernorm(attended, residual=x)
            return self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)), residual=x), k, v
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
        self.rope = RopeTables(arch)
        self.head: Projection | None = None
        """The head prepacked for the CPU's GEMM, made on the first read of the whole head (a decode step, a label
        readout) once `fuse_projections` allows it: a copy of the head, which TRUE/FALSE readouts never need."""
        self.pack_head = False
        self.row_decoder: kernels.RowDecoder | None = None
        """Every layer of a one-row pass (a decode step of one sequence) in one kernel call, where it runs."""

    def fuse_projections(self) -> None:
        """Fewer, wider GEMMs per layer (q/k/v and gate/up), with weights prepacked for the CPU's GEMM
        where it can take them (`projection.py`), and the one-call decode step where it runs; call once the weights
        are loaded, on their device and in their dtype (they are not changed after: the packed copies and the
        decode kernel read them as they are now)."""
        for block in self.layers:
            block.self_attn.fuse()
            block.mlp.fuse()
        self.pack_head = True
        self.row_decoder = kernels.row_decoder(self._decode_shape(), [block.decode_weights() for block in self.layers])

    def _decode_shape(self) -> kernels.DecodeShape:
        """The model's numbers as the one-row decode kernel reads them."""
        arch = self.arch
        return kernels.DecodeShape(arch.hidden, arch.heads, arch.kv_heads, arch.head_dim, arch.ffn, arch.gemma_norms,
                                   arch.activation == "gelu_tanh", arch.norm_eps, arch.attention_scale)

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
                layout: AttentionLayout, readout: torch.Tensor,
                written: WrittenRows | None = None) -> ForwardOutput:
        """Prefill `tokens` at `positions`; each segment of rows attends to its columns of each layer's
        `context` KV and to its own rows under its masks; hidden states only at `readout` rows. The
        `written` rows' KV goes into the context in each layer before any row attends."""
        x = self.embed(tokens)
        tables = self.rope(positions, x.dtype)
        if self.row_decoder is not None and written is None and x.shape[0] == 1 and readout.tolist() == [0]:
            decoded = self.row_decoder(x, context, layout.flat, layout.masks, tables)
            if decoded is not None:
                return ForwardOutput(self.norm(decoded.x), list(decoded.keys.unbind(0)),
                                     list(decoded.values.unbind(0)))
        keys, values = [], []
        last = len(self.layers) - 1
        for index, block in enumerate(self.layers):
            # Past the last layer's k and v only the read-out rows matter: the rest of it runs on them alone.
            x, k, v = block(x, tables[block.kind], context[index], layout, readout if index == last else None,
                            written)
            keys.append(k)
            values.append(v)
        return ForwardOutput(self.norm(x), keys, values)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, columns: torch.Tensor | None = None, fp32: bool = True) -> torch.Tensor:
        """Head logits at readout rows: only the given vocabulary `columns` when named. In fp32, or with
        `fp32=False` in the weights' own precision (a bf16 head is then not converted whole)."""
        weight = self.head_weight if columns is None else self.head_weight[columns]
        if not fp32 and columns is None and self.pack_head:  # the whole head, prepacked (1.4× faster at one row)
            if self.head is None:
                self.head = Projection(weight.detach())
            return self.head(hidden.to(weight.dtype))
        if not fp32:
            return hidden.to(weight.dtype) @ weight.T
        return hidden.float() @ weight.float().T

