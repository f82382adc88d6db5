"""A decode step of one sequence in one kernel call computes what the layers compute one by one.

Small random bf16 models of the three layer styles (Gemma 3: (1 + w) norms, post-norms, GELU, sliding layers —
and one of sliding layers only; Qwen3: QK-norm, SiLU; Qwen2: q/k/v bias, no QK-norm, the query scale after RoPE)
decode a sequence one token a pass over a prompt's kept KV, once with the one-call decoder and once layer by layer:
every step's hidden state and new KV are the same bits — past the sliding window too. (Over all 65,536 bf16
inputs the kernel's SiLU equals torch's but between −88.7 and −87, where torch's is a denormal and the kernel's −0.)
"""

from __future__ import annotations

import pytest
import torch

from quail_native.executor.arena import KVArena, KVShape
from quail_native.executor.packing import Item, Packer
from quail_native.models import kernels
from quail_native.models.transformer import Arch, Transformer

pytestmark = pytest.mark.skipif(kernels.one_row_status(torch.bfloat16) is None,
                                reason="the one-row decode kernel needs a CPU with AVX-512 BF16")

COMMON = dict(vocab=97, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=32, ffn=96, norm_eps=1e-6,
              rope_factor={"full": 1.0, "sliding": 1.0}, attention_scale=32 ** -0.5)
ARCHS = {
    "gemma3": Arch(family="gemma3", **COMMON, layer_types=("sliding", "full", "sliding"),
                   rope_theta={"full": 1e6, "sliding": 1e4}, sliding_window=9, activation="gelu_tanh",
                   tied_embeddings=True, embed_scale=8.0, gemma_norms=True),
    "gemma3_sliding": Arch(family="gemma3", **COMMON, layer_types=("sliding",) * 3,  # fewer layers than a pattern
                           rope_theta={"full": 1e6, "sliding": 1e4}, sliding_window=9, activation="gelu_tanh",
                           tied_embeddings=True, embed_scale=8.0, gemma_norms=True),
    "qwen3": Arch(family="qwen3", **COMMON, layer_types=("full",) * 3, rope_theta={"full": 1e6}, sliding_window=None,
                  activation="silu", tied_embeddings=True, embed_scale=None, gemma_norms=False),
    "qwen2": Arch(family="qwen2", **COMMON, layer_types=("full",) * 3, rope_theta={"full": 1e6}, sliding_window=None,
                  activation="silu", tied_embeddings=False, embed_scale=None, gemma_norms=False, qk_norm=False,
                  qkv_bias=True),
}


def model(kind: str) -> Transformer:
    torch.manual_seed(1)
    transformer = Transformer(ARCHS[kind])
    with torch.no_grad():
        for parameter in transformer.parameters():
            parameter.normal_(0.0, 0.3)
    transformer = transformer.to(torch.bfloat16).eval()
    transformer.fuse_projections()
    return transformer


def decode(transformer: Transformer, steps: int) -> list[tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]]:
    """A 14-token prompt, then `steps` passes of one token each over the sequence's KV so far: each step's hidden
    state and the keys and values it added."""
    arch = transformer.arch
    shape = KVShape(layers=arch.layers, kv_heads=arch.kv_heads, head_dim=arch.head_dim, dtype=torch.bfloat16)
    run = Packer(transformer, KVArena(shape, pages=64, page_tokens=4, device=torch.device("cpu")),
                 torch.device("cpu"))
    prompt = tuple(torch.randint(0, arch.vocab, (14,), generator=torch.Generator().manual_seed(2)).tolist())
    [first] = run.run([Item(prompt, 0, (), (13,), ((0, 14),))])
    block, length, token, out = first.blocks[0], 14, 5, []
    for step in range(steps):
        [result] = run.run([Item((token,), length, (block,), (0,), ((0, 1),))])
        [added] = result.blocks
        slots = run.arena.slots(added)
        out.append((result.hidden, [k[:, slots] for k in run.arena.keys], [v[:, slots] for v in run.arena.values]))
        block, length, token = run.arena.concat(block, added), length + 1, (token * 7 + step) % arch.vocab
    return out


@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_one_call_decodes_the_bits_the_layers_decode_one_by_one(kind: str) -> None:
    transformer = model(kind)
    assert transformer.row_decoder is not None
    calls = []
    decoder = transformer.row_decoder

    def counted(*args):
        decoded = decoder(*args)
        calls.append(decoded is not None)
        return decoded

    transformer.row_decoder = counted  # type: ignore[assignment]
    fused = decode(transformer, 12)
    assert calls == [True] * 12
    transformer.row_decoder = None
    layered = decode(transformer, 12)
    for (hidden, keys, values), (want_hidden, want_keys, want_values) in zip(fused, layered, strict=True):
        assert torch.equal(hidden, want_hidden)
        assert all(torch.equal(a, b) for a, b in zip(keys + values, want_keys + want_values, strict=True))


def test_a_pass_of_more_than_one_row_runs_the_layers() -> None:
    transformer = model("gemma3")
    decoder = transformer.row_decoder
    assert decoder is not None
    calls = []
    transformer.row_decoder = lambda *args: calls.append(args)  # type: ignore[assignment]
    decode(transformer, 0)  # the prompt's pass: 14 rows
    assert calls == []


def test_a_model_the_kernel_does_not_read_has_no_decoder() -> None:
    transformer = Transformer(ARCHS["qwen3"])  # fp32
    transformer.fuse_projections()
    assert transformer.row_decoder is None
