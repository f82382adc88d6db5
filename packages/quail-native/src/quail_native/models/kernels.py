"""Fused kernels for the CPU: C built once per machine, eager torch where it cannot be.

Eager torch makes one pass over memory per op, and on a 2-core CPU those passes were a fifth of a
forward pass. GELU-tanh(gate) · up of a 1,439-row bf16 pass took 4.6–5.3 ms eager and 1.4 ms as one
C loop (2 threads). torch.compile fuses the same, but compiled for 22 s on a cold machine; this file
compiles in 0.3 s. The library is built from `kernels.c` beside this module by the system C compiler
(`$CC`, else `cc`) for the CPU it runs on, and cached in Quail's cache directory under a key of the
source, the flags, the compiler and the CPU's features. Without a compiler, when the build fails, or
with `QUAIL_KERNELS=eager`, every call takes the eager path and `status()` says why.

Attention (`attention`) is one kernel call per layer for every segment of the pass: in bf16 on CPUs
with AVX-512 BF16 (blocks of 16 query rows in AMX tiles where the CPU has them), in fp32 on any CPU (plain
loops the compiler vectorises). torch's two GEMMs around a softmax compute the masked half of every causal
segment and pass over the scores more times (bench passes 8–12 % faster with the bf16 kernel on a 2-core
EPYC; whole fp32 queries 5–10 % faster with the fp32 one). Without a kernel for the dtype and CPU the
caller's GEMMs run.

A decode step of one sequence (bf16, AVX-512 BF16) runs on the kernels of one row: `one_row_projection` (a weight
read at the memory's rate), `head_top` (a greedy step's candidates found while the head streams past) and
`RowDecoder` (every layer in one call, over the kernels above). Batch-1 decoding of Gemma 3 270M went from 0.40–0.71
to 0.70–0.84 of the weight-bandwidth limit (`quail bench --generation`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from quail.extend import quail_cache_home
from quail_native.machine import cpu_features

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fno-trapping-math", "-fopenmp",
         "-shared", "-fPIC")
"""-fno-trapping-math lets the compiler turn the kernels' conditional selects into blends where the CPU has no
mask registers (AVX2): without it the fp32 GELU and softmax loops stayed scalar there (whole fp32 queries
5–6 % slower with torch limited to AVX2). Nothing here reads floating-point exception flags.
-mprefer-vector-width=512: GCC tunes Intel's AVX-512 CPUs for 256-bit vectors by default; the elementwise loops
vectorised 512 wide take 0.75–0.85× the time on a 2-core Sapphire Rapids Xeon. Without AVX-512 it changes nothing."""
BUILD_TIMEOUT_S = 120

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelStatus:
    fused: bool
    detail: str  # the library's path, or why the eager path runs


def status() -> KernelStatus:
    return _library()[1]


def gelu_tanh_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GELU-tanh(gate) · up (the gated MLP's activation), fused on a CPU when the library is built."""
    kernel = _kernel(_GELU_KERNELS, gate.dtype, _rows_of_one_projection(gate, up))
    if kernel is None:
        return gelu_tanh_times_eager(gate, up)
    out = torch.empty(gate.shape, dtype=gate.dtype)
    kernel(ctypes.c_void_p(gate.data_ptr()), ctypes.c_void_p(up.data_ptr()), ctypes.c_void_p(out.data_ptr()),
           ctypes.c_int64(gate.shape[0]), ctypes.c_int64(gate.shape[1]), ctypes.c_int64(gate.stride(0)))
    return out


class OneRowProjection:
    """`x @ weightᵀ (+ bias)` for a single bf16 row (a decode step of one sequence) in the library's kernel: one
    read of the weight at the memory's rate, where oneDNN's one-row GEMM reached ~0.8 of it. Made once per weight
    (`one_row_projection`), so a call checks only its row."""

    def __init__(self, kernel: Callable[..., object], weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self._kernel = kernel
        self._weight, self._bias = weight, bias  # kept alive: the kernel reads them by address
        self._operands = (ctypes.c_void_p(weight.data_ptr()), ctypes.c_int64(weight.shape[0]),
                          ctypes.c_int64(weight.shape[1]), ctypes.c_void_p(None if bias is None else bias.data_ptr()))
        self._shape, self._dtype = (1, weight.shape[1]), weight.dtype
        self._rows = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """[1, rows] for a [1, k] row of the weight's dtype whose k are contiguous; None for any other x, and for one
        that autograd would follow (the kernel's output has no gradient)."""
        if not (x.shape == self._shape and x.dtype == self._dtype and x.stride(1) == 1 and x.is_cpu
                and not (x.requires_grad and torch.is_grad_enabled())):
            return None
        out = torch.empty((1, self._rows), dtype=self._dtype)
        self._kernel(ctypes.c_void_p(x.data_ptr()), *self._operands, ctypes.c_void_p(out.data_ptr()))
        return out


def one_row_projection(weight: torch.Tensor, bias: torch.Tensor | None) -> OneRowProjection | None:
    """The one-row kernel for this weight, or None where it does not run: not bf16 on a CPU with AVX-512 BF16, no
    library, a weight that is not one contiguous [rows, k] block (or a bias not matching it)."""
    kernel = _kernel(_ONE_ROW_KERNELS, weight.dtype, _one_row_fits(weight, bias))
    return None if kernel is None else OneRowProjection(kernel, weight, bias)


def _one_row_fits(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The weights the one-row kernel reads: one contiguous [rows, k] block on the CPU, a bias of `rows` alike."""
    return (weight.is_cpu and weight.dim() == 2 and weight.is_contiguous()
            and (bias is None or (bias.is_cpu and bias.dim() == 1 and bias.is_contiguous()
                                  and bias.dtype == weight.dtype and bias.shape[0] == weight.shape[0])))


def head_top(x: torch.Tensor, head: torch.Tensor, top: int) -> torch.Tensor | None:
    """The `top` largest logits' token ids of one row over a [vocabulary, hidden] head ([top] long, largest first,
    ties to the lower id), computed in fp32 sums without writing the logits out — or None where the kernel does not
    run (then the caller multiplies the whole head). A greedy choice needs no more: the head is read once a step
    at the memory's rate."""
    fits = (x.dim() == 2 and x.shape[0] == 1 and x.dtype == head.dtype and x.stride(1) == 1 and x.is_cpu
            and head.is_cpu and head.dim() == 2 and head.is_contiguous() and x.shape[1] == head.shape[1]
            and 1 <= top <= min(HEAD_MAX_TOP, head.shape[0]))
    kernel = _kernel(_HEAD_TOP_KERNELS, head.dtype, fits)
    if kernel is None:
        return None
    indices = torch.empty(top, dtype=torch.long)
    refused = kernel(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(head.data_ptr()), ctypes.c_int64(head.shape[0]),
                     ctypes.c_int64(head.shape[1]), ctypes.c_int64(top), ctypes.c_void_p(indices.data_ptr()))
    # a row of NaN keeps no logit (-1 ids): the caller's path decides what such a row chooses
    return None if refused or bool((indices < 0).any()) else indices


def one_row_status(dtype: torch.dtype) -> str | None:
    """For the report: what computes a decode step's one-row projections and head here, when not oneDNN."""
    library = _library()[0] if dtype in _ONE_ROW_KERNELS else None
    if library is None or not hasattr(library, _ONE_ROW_KERNELS[dtype]):
        return None
    return "one row (a decode step) and the greedy head in Quail's bf16 kernel"


class _DecodeLayer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "qkv", "qkv_bias", "o", "gate_up", "down", "input_norm", "post_attention_norm", "pre_feedforward_norm",
        "post_feedforward_norm", "q_norm", "k_norm", "arena_keys", "arena_values")] + [("sliding", ctypes.c_int64)]


class _DecodeStep(ctypes.Structure):
    _fields_ = ([(name, ctypes.c_int64) for name in ("hidden", "heads", "kv_heads", "head_dim", "ffn", "gemma_norms",
                                                     "gelu")]
                + [("eps", ctypes.c_float), ("attention_scale", ctypes.c_float)]
                + [(name, ctypes.c_int64) for name in ("arena_head_stride", "segments")]
                + [(name, ctypes.c_void_p) for name in ("slots", "shapes")]
                + [(name, ctypes.c_void_p * 2) for name in ("masks", "cos", "sin")])


@dataclass(frozen=True)
class DecodeLayerWeights:
    """One layer as the decode kernel reads it: fused projection weights (contiguous bf16), norm weights as the
    norm kernels apply them (`applied_norm`), and which RoPE tables and mask it takes."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    pre_feedforward_norm: torch.Tensor | None
    post_feedforward_norm: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    sliding: bool


@dataclass(frozen=True)
class DecodeShape:
    """The numbers and switches of the model the decode kernel reads (`Arch`'s, as the kernel's `DecodeStep` holds
    them)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    gemma_norms: bool
    gelu: bool
    eps: float
    attention_scale: float


@dataclass(frozen=True)
class DecodedRow:
    """What a one-call decode step gives back: what the layer-by-layer pass gives for one row."""

    x: torch.Tensor  # [1, hidden]: the last layer's output, before the final norm
    keys: torch.Tensor  # [layers, kv_heads, 1, head_dim]
    values: torch.Tensor


class RowDecoder:
    """A decode step of one sequence through every layer in one call of the library's kernel (the same kernels and
    roundings as the layer-by-layer pass, without ~150 µs of Python between a layer's dozen operations). Made once
    per model (`row_decoder`), over its weights as they are then (frozen from `fuse_projections` on, as the packed
    copies are); a call returns None for a pass the kernel does not read, and the caller runs the layers one by one.
    One caller at a time, as an engine serves one request at a time (the layer structs point at the arena in use)."""

    def __init__(self, kernel: Callable[..., object], shape: DecodeShape, layers: Sequence[DecodeLayerWeights]) -> None:
        self._kernel, self._shape, self._layers = kernel, shape, tuple(layers)
        self._arena: tuple[int, ...] = ()
        self._structs = (_DecodeLayer * len(self._layers))()

    def __call__(self, x: torch.Tensor, context: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 segments: FlatSegments | None, masks: dict[str, torch.Tensor],
                 tables: dict[str, tuple[torch.Tensor, ...]]) -> DecodedRow | None:
        """One row x [1, hidden] over the layers' arena KV `context` under the pass's one-row layout."""
        shape = self._shape
        if not self._reads(x, segments, masks, tables) or segments is None or not self._point_at(context):
            return None
        step = _DecodeStep(shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn, shape.gemma_norms,
                           shape.gelu, shape.eps, shape.attention_scale, context[0][0].stride(0),
                           segments.shapes.shape[0], segments.slots.data_ptr(), segments.shapes.data_ptr())
        for index, kind in enumerate(("full", "sliding")):
            step.masks[index] = masks[kind].data_ptr()
            cos, sin = (tables.get(kind) or next(iter(tables.values())))[:2]  # a kind no layer has: any table
            step.cos[index], step.sin[index] = cos.data_ptr(), sin.data_ptr()
        out = x.clone()
        keys = torch.empty((len(self._layers), shape.kv_heads, 1, shape.head_dim), dtype=x.dtype)
        values = torch.empty_like(keys)
        failed = self._kernel(self._structs, ctypes.c_int64(len(self._layers)), ctypes.byref(step),
                              ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(keys.data_ptr()),
                              ctypes.c_void_p(values.data_ptr()))
        if failed:
            raise MemoryError("the decode kernel could not allocate its scratch")
        return DecodedRow(out, keys, values)

    def _reads(self, x: torch.Tensor, segments: FlatSegments | None, masks: dict[str, torch.Tensor],
               tables: dict[str, tuple[torch.Tensor, ...]]) -> bool:
        """What the kernel reads of a pass: one contiguous bf16 row, a one-row layout with its masks, contiguous
        one-row RoPE tables (the arena's KV: `_point_at`)."""
        shape = self._shape
        if not (x.dtype == torch.bfloat16 and x.is_cpu and x.shape == (1, shape.hidden) and x.is_contiguous()
                and segments is not None and segments.rows == 1):
            return False
        if any(not (m.dtype == torch.bool and m.is_contiguous() and m.numel() == segments.mask_entries)
               for m in (masks["full"], masks["sliding"])):
            return False
        return bool(tables) and all(t.dtype == x.dtype and t.is_contiguous() and t.shape == (1, shape.head_dim)
                                    for pair in tables.values() for t in pair[:2])

    def _point_at(self, context: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """The layer structs pointed at the arena's KV, checked and filled when its tensors are not the ones they
        point at (an arena's tensors keep their layout: a decode step checks only their addresses). False for KV
        the kernel does not read: not every layer's [kv_heads, slots, head_dim] bf16 on the CPU, alike."""
        arena = tuple(t.data_ptr() for pair in context for t in pair)
        if arena == self._arena:
            return True
        if not self._reads_arena(context):
            return False
        for struct, layer, (keys, values) in zip(self._structs, self._layers, context, strict=True):
            for name in ("qkv", "qkv_bias", "o", "gate_up", "down", "input_norm", "post_attention_norm",
                         "pre_feedforward_norm", "post_feedforward_norm", "q_norm", "k_norm"):
                tensor = getattr(layer, name)
                setattr(struct, name, None if tensor is None else tensor.data_ptr())
            struct.arena_keys, struct.arena_values = keys.data_ptr(), values.data_ptr()
            struct.sliding = layer.sliding
        self._arena = arena
        return True

    def _reads_arena(self, context: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        shape = self._shape
        if len(context) != len(self._layers):
            return False
        first = context[0][0]
        if not (first.dtype == torch.bfloat16 and first.is_cpu and first.dim() == 3 and first.shape[0] == shape.kv_heads
                and first.shape[2] == shape.head_dim and first.stride()[1:] == (shape.head_dim, 1)):
            return False
        return all(k.stride() == v.stride() == first.stride() and k.shape == v.shape == first.shape
                   and k.dtype == v.dtype == first.dtype and k.is_cpu and v.is_cpu for k, v in context)


def row_decoder(shape: DecodeShape, layers: Sequence[DecodeLayerWeights]) -> RowDecoder | None:
    """The one-row decode kernel for these layers, or None where it does not run: not bf16 weights on a CPU with
    AVX-512 BF16, no library, head_dim not a multiple of 32 (the attention kernel's), a weight the one-row
    projection does not take."""
    fits = shape.head_dim % 32 == 0 and all(
        _one_row_fits(weight, bias) and weight.dtype == layers[0].qkv.dtype
        for layer in layers for weight, bias in ((layer.qkv, layer.qkv_bias), (layer.o, None), (layer.gate_up, None),
                                                 (layer.down, None)))
    kernel = _kernel(_DECODE_KERNELS, layers[0].qkv.dtype if layers else torch.float32, fits and bool(layers))
    return None if kernel is None else RowDecoder(kernel, shape, layers)


def silu_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) · up (Qwen's gated MLP): one pass in bf16 on a CPU when the library is built, with the bits of
    `F.silu(gate).mul_(up)` (which takes two passes); other dtypes take those two ops."""
    kernel = _kernel(_SILU_KERNELS, gate.dtype, _rows_of_one_projection(gate, up))
    if kernel is None:
        return F.silu(gate).mul_(up)
    out = torch.empty(gate.shape, dtype=gate.dtype)
    kernel(ctypes.c_void_p(gate.data_ptr()), ctypes.c_void_p(up.data_ptr()), ctypes.c_void_p(out.data_ptr()),
           ctypes.c_int64(gate.shape[0]), ctypes.c_int64(gate.shape[1]), ctypes.c_int64(gate.stride(0)))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dimension (Gemma's (1 + w) scale or Qwen's w), plus `residual` when given:
    one pass on a CPU when the library is built."""
    rows = _norm_rows(x, residual)
    kernel = _kernel(_NORM_KERNELS, x.dtype, rows is not None)
    if kernel is None or rows is None:
        return rms_norm_eager(x, weight, eps, gemma, residual)
    return _normalized(kernel, x, rows, weight, eps, gemma, None if residual is None else residual.data_ptr())


def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
                   residual: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """The same in torch ops: in place where the buffer is ours (each pass costs as much as the arithmetic).
    `scale` multiplies the weight in fp32 (the attention scale folded into q, see `rms_norm_rope`)."""
    wide = x.float()
    normed = wide * wide.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    if gemma:
        out = normed.mul_((1.0 + weight.float()) * scale).type_as(x)
    else:  # Qwen rounds the normalised row first, as its reference does
        out = (weight.float() * scale * normed.to(x.dtype)).to(x.dtype)
    return out if residual is None else residual + out


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, cos: torch.Tensor,
                  signed_sin: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """RMSNorm of [tokens, heads, head_dim] heads, then RoPE with [tokens, head_dim] tables (see `rotate`):
    one pass on a CPU when the library is built. Returns [tokens, heads, head_dim].

    `scale` multiplies the norm's weight (RoPE is linear): attention passes its score scale here, so the
    queries carry it and the scores need no pass of their own — and none in fp32, which is what lets a
    bf16 softmax read the scores as the GEMM wrote them."""
    rows = _norm_rows(x, None) if x.dim() == 3 else None
    tables = all(table.dtype == x.dtype and table.is_contiguous() and table.shape == (x.shape[0], x.shape[-1])
                 for table in (cos, signed_sin))
    kernel = _kernel(_NORM_ROPE_KERNELS, x.dtype, rows is not None and tables)
    if kernel is None or rows is None:
        return rotate(rms_norm_eager(x, weight, eps, gemma, scale=scale), cos[:, None], signed_sin[:, None])
    return _normalized(kernel, x, rows, weight, eps, gemma, cos.data_ptr(), signed_sin.data_ptr(), scale=scale)


def _normalized(kernel: Callable[..., object], x: torch.Tensor, rows: tuple[int, int, int], weight: torch.Tensor,
                eps: float, gemma: bool, *operands: int | None, scale: float = 1.0) -> torch.Tensor:
    """Call a norm kernel: x's rows, the weight as the kernel applies it (times `scale`, in fp32), then its
    own `operands` (pointers)."""
    outer, outer_stride, groups = rows
    applied = applied_norm(weight, gemma, scale)
    out = torch.empty(x.shape, dtype=x.dtype)
    kernel(ctypes.c_void_p(x.data_ptr()), ctypes.c_int64(outer), ctypes.c_int64(outer_stride), ctypes.c_int64(groups),
           ctypes.c_int64(x.shape[-1]), ctypes.c_void_p(applied.data_ptr()), ctypes.c_float(eps), ctypes.c_int(gemma),
           *(ctypes.c_void_p(operand) for operand in operands), ctypes.c_void_p(out.data_ptr()))
    return out


def applied_norm(weight: torch.Tensor, gemma: bool, scale: float = 1.0) -> torch.Tensor:
    """The weight as a norm kernel applies it ((1 + w) or w, times `scale`, fp32), made once per weight and kept on
    it: a decode step calls ~100 norms over one row each, where four small tensor ops per call cost more than the
    norm. Keyed by the weight's version too, so a weight changed in place is applied afresh."""
    made: dict[tuple[bool, float, int], torch.Tensor] = weight.__dict__.setdefault("_quail_applied", {})
    key = (gemma, scale, weight._version)
    found = made.get(key)
    if found is None:
        found = made[key] = (((1.0 + weight.float()) if gemma else weight.float()) * scale).contiguous()
    return found


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE over the last dimension (the half-split convention) with tables broadcast against x.

    The sine table carries the rotation's sign (−sin on the first half), so the halves are only
    swapped, not negated: one pass fewer over q and k.
    """
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return (x * cos).addcmul_(swapped, signed_sin)


SIGMOID_LINEAR = 2.0 * math.sqrt(2.0 / math.pi)
SIGMOID_CUBIC = SIGMOID_LINEAR * 0.044715


def gelu_tanh_times_eager(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GELU-tanh(gate) · up, as gate · σ(2u) with u = √(2/π)(gate + 0.044715 gate³).

    The same function (0.5(1 + tanh u) = σ(2u)), written so that it runs in one buffer: torch's CPU
    tanh is about three times slower than its sigmoid, and F.gelu(…, "tanh") · up was the largest
    elementwise cost of a pass (measured 6.2 → 3.9 ms on [1024, 2048] fp32, 2 threads).
    """
    wide = gate.float()  # bf16 computes in fp32 like F.gelu does inside; fp32 is unchanged (no copy)
    inner = wide * wide
    inner.mul_(SIGMOID_CUBIC).add_(SIGMOID_LINEAR).mul_(wide)
    return inner.sigmoid_().mul_(wide).to(gate.dtype).mul_(up)


@dataclass(frozen=True)
class FlatSegments:
    """A pass's segments as `attention` reads them, checked once (`flat_segments`) for every layer that attends.

    Segment s has shapes[s] = (own rows, context columns); `slots` holds the segments' context slots one after
    the other; a mask for them flattens each segment's [own rows, context + own rows] mask one after the other,
    `mask_entries` in all. `rows` is the pass's: the segments' own rows, in order."""

    shapes: torch.Tensor  # long [segments, 2], contiguous
    slots: torch.Tensor  # long [Σ context columns], contiguous
    rows: int
    mask_entries: int


def flat_segments(shapes: torch.Tensor, slots: torch.Tensor) -> FlatSegments | None:
    """The layout checked and summed once per pass (it cost a layer 0.1 ms of torch reductions when each layer
    checked it); None where the kernel cannot read it: not on a CPU, not contiguous long tensors, negative
    sizes, or slots that are not the shapes' context columns."""
    if not (shapes.is_cpu and slots.is_cpu and _long_vector(slots) and shapes.dim() == 2 and shapes.shape[1] == 2
            and shapes.is_contiguous() and shapes.dtype == torch.long) or bool((shapes < 0).any()):
        return None
    own, context = shapes.unbind(1)
    if int(context.sum()) != slots.numel():
        return None
    return FlatSegments(shapes, slots, int(own.sum()), int((own * (own + context)).sum()))


def attention(q: torch.Tensor, out: torch.Tensor, queries: torch.Tensor | None,
              context: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor, values: torch.Tensor,
              segments: FlatSegments | None, mask: torch.Tensor) -> bool:
    """Masked attention of a whole pass into `out`, every segment in one call of the fused kernel: True when it
    ran, False (nothing written) where it cannot — no kernel for this dtype here, no `segments`, or operands it
    does not read — and the caller's GEMM path runs instead.

    The pass's rows form `segments`, in order: each reads its context columns from the arena's [kv_heads,
    slots, head_dim] keys and values (`context`) at its run of slots, then its own rows of the pass's [tokens,
    kv_heads, head_dim] `keys` and `values`, under its bool [rows, context + rows] part of `mask` (True = may
    attend). q and out: [queries, heads, head_dim] (queries already scaled); query i is pass row queries[i], or
    row i when `queries` is None. The slots are not re-checked: they come from `KVArena.slots`, inside the arena
    by construction. A row that may attend to nothing gets zeros (the GEMMs give NaN); causal masks always show
    a row itself."""
    kernel = _kernel(_ATTENTION_KERNELS, q.dtype, _attention_fits(q, out, queries, context, keys, values, segments,
                                                                  mask))
    if kernel is None or segments is None:
        return False
    shapes, slots = segments.shapes, segments.slots
    arena_keys, arena_values = context
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    failed = kernel(pointer(q.data_ptr()), size(q.stride(0)), pointer(out.data_ptr()), size(out.stride(0)),
                    size(q.shape[0]), pointer(None if queries is None else queries.data_ptr()),
                    pointer(arena_keys.data_ptr()), pointer(arena_values.data_ptr()), size(arena_keys.stride(0)),
                    pointer(slots.data_ptr()), pointer(keys.data_ptr()), size(keys.stride(0)),
                    pointer(values.data_ptr()), size(values.stride(0)), pointer(shapes.data_ptr()),
                    size(shapes.shape[0]), pointer(mask.data_ptr()), size(q.shape[1]), size(keys.shape[1]),
                    size(q.shape[2]))
    if failed:
        raise MemoryError(f"the attention kernel could not allocate its scratch for a pass of {keys.shape[0]} rows "
                          f"in {shapes.shape[0]} segments")
    return True


def attention_status(dtype: torch.dtype) -> str:
    """How a CPU pass in `dtype` attends, for the report."""
    if dtype not in _ATTENTION_KERNELS:
        return f"two GEMMs around a softmax (the fused kernels are bf16 and fp32, not {dtype})"
    library, state = _library()
    if library is None:
        return f"two GEMMs around a softmax ({state.detail})"
    if not hasattr(library, _ATTENTION_KERNELS[dtype]):
        return "two GEMMs around a softmax (the fused kernel needs AVX-512 BF16: this CPU or its compiler lacks it)"
    if dtype == torch.float32:
        return "fused fp32 kernel"
    tiles = getattr(library, "quail_attention_bf16_tiles", None)
    if tiles is not None and tiles():
        return "fused bf16 kernel (AMX tiles; AVX-512 BF16 for blocks of under 4 rows)"
    return "fused bf16 kernel (AVX-512 BF16)"


def _attention_fits(q: torch.Tensor, out: torch.Tensor, queries: torch.Tensor | None,
                    context: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor, values: torch.Tensor,
                    segments: FlatSegments | None, mask: torch.Tensor) -> bool:
    """The layouts the kernel reads: rows of heads of contiguous head_dim vectors, the arena's kv heads each
    a contiguous [slots, head_dim], contiguous long query rows, a contiguous bool mask of the segments' size;
    head_dim a multiple of 32; the segments' rows those of the pass (their own sums are `flat_segments`')."""
    if segments is None or torch.is_grad_enabled():
        return False
    arena_keys, arena_values = context
    tensors = (q, out, arena_keys, arena_values, keys, values, mask)
    if not all(t.is_cpu for t in tensors):  # is_cpu: a fifth of device.type's cost
        return False
    rows, heads, dim = q.shape if q.dim() == 3 else (0, 0, 0)
    kv_heads = keys.shape[1] if keys.dim() == 3 else 0
    return (dim % 32 == 0 and dim > 0 and kv_heads > 0 and heads % kv_heads == 0
            and all(t.dtype == q.dtype for t in (arena_keys, arena_values, keys, values, out))
            and all(_heads_of_rows(t) for t in (q, keys, values, out)) and out.shape == q.shape
            and keys.shape == values.shape == (keys.shape[0], kv_heads, dim) and keys.shape[0] == segments.rows
            and arena_keys.shape == arena_values.shape and arena_keys.stride() == arena_values.stride()
            and arena_keys.dim() == 3 and arena_keys.shape[0] == kv_heads and arena_keys.shape[2] == dim
            and arena_keys.stride()[1:] == (dim, 1)
            and (_rows_within(queries, rows, keys.shape[0]) if queries is not None else rows == keys.shape[0])
            and mask.dtype == torch.bool and mask.is_contiguous() and mask.numel() == segments.mask_entries)


def _long_vector(t: torch.Tensor) -> bool:
    return t.dtype == torch.long and t.dim() == 1 and t.is_contiguous()


def _rows_within(queries: torch.Tensor, count: int, rows: int) -> bool:
    """`count` query rows, each a row of the pass's `rows` (the kernel reads its mask row)."""
    return (queries.is_cpu and _long_vector(queries) and queries.numel() == count
            and (count == 0 or (int(queries.min()) >= 0 and int(queries.max()) < rows)))


def _heads_of_rows(t: torch.Tensor) -> bool:
    """[rows, heads, dim] with each row's heads contiguous (rows may be any stride apart)."""
    return t.dim() == 3 and t.stride()[1:] == (t.shape[2], 1)


_ATTENTION_KERNELS = {torch.bfloat16: "quail_attention_bf16", torch.float32: "quail_attention_f32"}
_GELU_KERNELS = {torch.bfloat16: "quail_gelu_tanh_times_bf16", torch.float32: "quail_gelu_tanh_times_f32"}
_SILU_KERNELS = {torch.bfloat16: "quail_silu_times_bf16"}  # fp32: torch's own exp, which the library's differs from
_NORM_KERNELS = {torch.bfloat16: "quail_rms_norm_bf16", torch.float32: "quail_rms_norm_f32"}
_NORM_ROPE_KERNELS = {torch.bfloat16: "quail_rms_norm_rope_bf16", torch.float32: "quail_rms_norm_rope_f32"}
_ONE_ROW_KERNELS = {torch.bfloat16: "quail_gemv_bf16"}  # these two need AVX-512 BF16: absent from other builds
_HEAD_TOP_KERNELS = {torch.bfloat16: "quail_head_top_bf16"}
_DECODE_KERNELS = {torch.bfloat16: "quail_decode_row_bf16"}
HEAD_MAX_TOP = 16
"""The most candidates `head_top` keeps (the kernel's HEAD_MAX_TOP)."""


def _norm_rows(x: torch.Tensor, residual: torch.Tensor | None) -> tuple[int, int, int] | None:
    """(outer, outer stride, groups) when x's rows are `groups` contiguous rows of width every outer stride
    (a [tokens, hidden] tensor, or [tokens, heads, head_dim] heads cut from a wider projection); else None."""
    if not x.is_cpu or x.dim() not in (2, 3) or x.stride(-1) != 1 or torch.is_grad_enabled():
        return None
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                 or not residual.is_cpu or not residual.is_contiguous()):
        return None
    groups = x.shape[1] if x.dim() == 3 else 1
    if x.dim() == 3 and x.stride(1) != x.shape[2]:
        return None
    return x.shape[0], x.stride(0), groups


def _rows_of_one_projection(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """The layout the kernel reads: 2-D CPU rows, contiguous within a row, gate and up rows equally apart."""
    return (gate.is_cpu and up.is_cpu and gate.dim() == 2 and up.shape == gate.shape
            and up.dtype == gate.dtype and gate.stride(1) == 1 and up.stride(1) == 1
            and gate.stride(0) == up.stride(0) and not torch.is_grad_enabled())


def _kernel(names: dict[torch.dtype, str], dtype: torch.dtype, fits: bool) -> Callable[..., object] | None:
    """The library's kernel for `dtype` when the arguments fit it and the library has it (the attention
    kernel in bf16 exists only where the CPU and compiler have AVX-512 BF16); the library is built on first need,
    so a run with no CPU tensors never builds it."""
    if not fits or dtype not in names:
        return None
    library = _library()[0]
    return None if library is None else getattr(library, names[dtype], None)


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, KernelStatus]:
    if os.environ.get("QUAIL_KERNELS", "").strip().lower() == "eager":
        return None, KernelStatus(False, "eager: QUAIL_KERNELS=eager")
    compiler = shutil.which(os.environ.get("CC", "").strip() or "cc")
    if compiler is None:
        return None, KernelStatus(False, "eager: no C compiler ($CC or cc) to build the fused kernels")
    try:
        path = _built(compiler)
        library = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("fused CPU kernels unavailable, using eager torch: %s", error)
        return None, KernelStatus(False, f"eager: building the fused kernels failed ({error})")
    return library, KernelStatus(True, f"fused C kernels ({path})")


def _built(compiler: str) -> Path:
    """The cached library for this source, compiler and CPU; built (atomically) when missing or damaged.

    A library is loaded only when its bytes match the digest written beside it when it was built: the
    loader maps a file cut short (a full disk, a killed copy) and the process dies of SIGBUS, so a damaged
    cache must be found before loading, never by it."""
    directory = quail_cache_home() / "kernels"
    path = directory / f"elementwise-{_build_key(compiler)}.so"
    recorded = path.with_name(path.name + ".sha256")
    if path.is_file() and recorded.is_file() and recorded.read_text().strip() == _digest(path):
        return path
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        partial = Path(scratch) / path.name
        run = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(partial)], capture_output=True,
                             text=True, timeout=BUILD_TIMEOUT_S)
        if run.returncode != 0:
            raise subprocess.SubprocessError(f"{compiler} exited {run.returncode}: {run.stderr.strip()[-400:]}")
        digest = Path(scratch) / recorded.name
        digest.write_text(_digest(partial))
        os.replace(partial, path)
        os.replace(digest, recorded)
    return path


def _digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _build_key(compiler: str) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), version.encode(), cpu_features().encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]
