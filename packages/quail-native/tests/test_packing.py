"""Packed passes on their own: an item continuing a sibling of its pass sees exactly the sibling's first rows.

The reference is the same tokens computed the plain way — one item from the start, alone in its pass — on a
small random Gemma-shaped model in fp32 (sliding and full layers), so any row the mask lets through that it
should not (the rows between a lender's prefix and its rider, another sibling) or keeps out that it should
shows as a different hidden state or KV.
"""

from __future__ import annotations

import pytest
import torch

from quail_native.executor.arena import KVArena, KVShape
from quail_native.executor.packing import Item, Packer
from quail_native.models.transformer import Arch, Transformer

ARCH = Arch(family="gemma3", vocab=97, hidden=64, layers=3, heads=4, kv_heads=1, head_dim=32, ffn=96,
            norm_eps=1e-6, layer_types=("sliding", "full", "sliding"), rope_theta={"full": 1e6, "sliding": 1e4},
            rope_factor={"full": 1.0, "sliding": 1.0}, sliding_window=9, attention_scale=32 ** -0.5,
            activation="gelu_tanh", tied_embeddings=True, embed_scale=8.0, gemma_norms=True)


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    transformer = Transformer(ARCH)
    with torch.no_grad():
        for parameter in transformer.parameters():
            parameter.normal_(0.0, 0.3)
    transformer.fuse_projections()
    return transformer.eval()


def packer(model: Transformer) -> Packer:
    shape = KVShape(layers=ARCH.layers, kv_heads=ARCH.kv_heads, head_dim=ARCH.head_dim, dtype=torch.float32)
    return Packer(model, KVArena(shape, pages=64, page_tokens=4, device=torch.device("cpu")), torch.device("cpu"))


def tokens(count: int, seed: int) -> tuple[int, ...]:
    return tuple(torch.randint(0, ARCH.vocab, (count,), generator=torch.Generator().manual_seed(seed)).tolist())


def alone(model: Transformer, sequence: tuple[int, ...], keep_from: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The last row's hidden state and the keys from `keep_from` on, computing `sequence` as one item."""
    run = packer(model)
    [result] = run.run([Item(sequence, 0, (), (len(sequence) - 1,), ((keep_from, len(sequence) - keep_from),))])
    return result.hidden, kept_keys(run, result.blocks[0])


def kept_keys(run: Packer, block: int) -> list[torch.Tensor]:
    slots = run.arena.slots(block)
    return [keys[:, slots] for keys in run.arena.keys]


@pytest.mark.parametrize("preamble", [0, 5])
def test_riders_see_their_lenders_first_rows_and_nothing_else_of_the_pass(model, preamble):
    """A lender, an unrelated sibling between, a rider on 12 of its rows, and a rider continuing that rider
    (a chain: 12 lender rows, then 3 of the first rider's): each rider reads out and keeps what computing
    its whole sequence alone gives."""
    run = packer(model)
    parents: tuple[int, ...] = ()
    if preamble:
        [pre] = run.run([Item(tokens(preamble, 1), 0, keep=((0, preamble),))])
        parents = pre.blocks
    head = tokens(preamble, 1)
    lender = Item(tokens(20, 2), preamble, parents, (19,), ((0, 20),))
    sibling = Item(tokens(7, 3), preamble, parents, (6,))
    rider = Item(tokens(6, 4), preamble + 12, parents, (5,), ((0, 6),), lender, 12)
    second = Item(tokens(4, 5), preamble + 15, parents, (3,), ((0, 4),), rider, 3)
    results = run.run([lender, sibling, rider, second])
    cases = [(rider, results[2], lender.tokens[:12] + rider.tokens),
             (second, results[3], lender.tokens[:12] + rider.tokens[:3] + second.tokens),
             (sibling, results[1], sibling.tokens), (lender, results[0], lender.tokens)]
    for item, result, sequence in cases:
        hidden, keys = alone(model, head + sequence, preamble + len(sequence) - len(item.tokens))
        torch.testing.assert_close(result.hidden, hidden, rtol=1e-5, atol=1e-5)
        if result.blocks:
            for got, want in zip(kept_keys(run, result.blocks[0]), keys, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_rider_in_a_pass_split_into_segments_stays_with_its_lender(model, monkeypatch):
    """Segments split where rows outgrow their context; never between a lender and its rider."""
    run = packer(model)
    short = [Item(tokens(3, 10 + i), 0, (), (2,)) for i in range(6)]
    lender = Item(tokens(16, 20), 0, (), (15,))
    rider = Item(tokens(5, 21), 14, (), (4,), (), lender, 14)
    results = run.run([*short, lender, *short[:2], rider])
    hidden, _ = alone(model, lender.tokens[:14] + rider.tokens, 14)
    torch.testing.assert_close(results[-1].hidden, hidden, rtol=1e-5, atol=1e-5)


def test_an_item_continuing_what_it_cannot_see_is_refused(model):
    lender = Item(tokens(8, 30), 0)
    with pytest.raises(ValueError, match="same parents"):
        Item(tokens(3, 31), 5, (7,), lender=lender, lent=5)
    with pytest.raises(ValueError, match="starts at"):
        Item(tokens(3, 31), 4, lender=lender, lent=5)
    with pytest.raises(ValueError, match="before it"):
        packer(model).run([Item(tokens(3, 31), 5, lender=lender, lent=5)])


def test_items_read_a_preamble_computed_at_the_front_of_their_own_pass(model):
    """A block reserved for a preamble and computed into during the pass: items reading it as a parent in
    that same pass get what they get once it was computed in a pass before."""
    run = packer(model)
    head = tokens(5, 40)
    documents = [tokens(9, 41), tokens(4, 42)]
    pre = run.arena.reserve(0, len(head))
    results = run.run([Item(head, 0, into=pre),
                       *(Item(doc, len(head), (pre,), (len(doc) - 1,), ((0, len(doc)),)) for doc in documents)])
    assert results[0].blocks == (pre,)
    for document, result in zip(documents, results[1:], strict=True):
        hidden, keys = alone(model, head + document, len(head))
        torch.testing.assert_close(result.hidden, hidden, rtol=1e-5, atol=1e-5)
        for got, want in zip(kept_keys(run, result.blocks[0]), keys, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    _, preamble_keys = alone(model, head, 0)
    for got, want in zip(kept_keys(run, pre), preamble_keys, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_pass_that_fails_leaves_no_unwritten_preamble_behind(model, monkeypatch):
    from quail_native.executor.memory import Memory, RecomputeCost
    from quail_native.executor.state import Budget, SharedState

    run = packer(model)
    state = SharedState(run, Memory(run.arena, RecomputeCost.of(ARCH)), Budget(64))
    head = tokens(5, 50)
    pre = state.preamble(head)
    assert state.preamble(head) == pre and state.room == 64 - len(head)

    def broken(*args, **kwargs):
        raise RuntimeError("the model failed")

    monkeypatch.setattr(model, "forward", broken)
    with pytest.raises(RuntimeError, match="the model failed"):
        state.run([Item(tokens(3, 51), len(head), (pre,), (2,))])
    assert pre not in run.arena and run.arena.used_pages == 0 and state.room == 64
    monkeypatch.undo()
    again = state.preamble(head)
    [result] = state.run([Item(tokens(3, 51), len(head), (again,), (2,))])
    hidden, _ = alone(model, head + tokens(3, 51), len(head))
    torch.testing.assert_close(result.hidden, hidden, rtol=1e-5, atol=1e-5)
