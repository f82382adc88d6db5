"""The paged KV arena and its eviction policy, on their own: pages, sharing, admission, priorities."""

from __future__ import annotations

import pytest
import torch

from quail.errors import RefusalError
from quail_native.executor.arena import ArenaFull, KeptSpan, KVArena, KVShape
from quail_native.executor.memory import Memory, RecomputeCost

SHAPE = KVShape(layers=2, kv_heads=1, head_dim=4, dtype=torch.float32)
PAGE = 4


def span(length: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    keys = [torch.randn(1, length, 4, generator=generator) for _ in range(SHAPE.layers)]
    return keys, [k * 2 for k in keys]


def stored(kv: KVArena, start: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
    """A block of one span's KV (per layer [kv_heads, length, head_dim]) at positions from `start`."""
    return kv.add_spans([KeptSpan(start, 0, keys[0].shape[1])], keys, values)[0]


def arena(pages: int = 8) -> KVArena:
    return KVArena(SHAPE, pages, PAGE, torch.device("cpu"))


def read(kv: KVArena, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer 0's keys and values and layer 1's keys of a block, read at its slots as attention reads them."""
    slots = kv.slots(block)
    return kv.keys[0][:, slots], kv.values[0][:, slots], kv.keys[1][:, slots]


def test_a_passes_kept_spans_each_come_back_as_their_rows_of_the_pass():
    """Spans kept from one pass (any rows, any order, a part-page each) are stored together, each block reading
    back exactly its rows at its positions; spans that do not all fit allocate nothing."""
    kv = arena(8)
    keys, values = span(20, 3)
    spans = [KeptSpan(100, 13, 5), KeptSpan(7, 0, 4), KeptSpan(40, 5, 1)]
    blocks = kv.add_spans(spans, keys, values)
    assert kv.used_pages == 2 + 1 + 1
    for block, kept in zip(blocks, spans, strict=True):
        rows = slice(kept.row, kept.row + kept.length)
        assert kv.get(block).positions.tolist() == list(range(kept.start, kept.start + kept.length))
        k0, v0, k1 = read(kv, block)
        assert torch.equal(k0, keys[0][:, rows]) and torch.equal(v0, values[0][:, rows])
        assert torch.equal(k1, keys[1][:, rows])
    with pytest.raises(ArenaFull):
        kv.add_spans([KeptSpan(0, 0, 8), KeptSpan(0, 8, 12)], keys, values)  # 2 + 3 pages, 4 free
    assert kv.used_pages == 4 and len(kv) == 3


def test_blocks_come_back_exactly_in_whole_pages():
    kv = arena()
    keys, values = span(6, 0)
    block = stored(kv, 10, keys, values)
    assert kv.used_pages == 2 and kv.get(block).positions.tolist() == list(range(10, 16))
    k0, v0, k1 = read(kv, block)
    assert torch.equal(k0, keys[0]) and torch.equal(v0, values[0]) and torch.equal(k1, keys[1])


def test_a_view_shares_pages_until_the_last_reader_frees_them():
    kv = arena()
    lender = stored(kv, 0, *span(10, 1))
    view = kv.view(lender, 8)
    assert kv.used_pages == 3 and kv.exclusive_pages(lender) == 1 and kv.exclusive_pages(view) == 0
    kv.free(lender)
    assert kv.used_pages == 2 and kv.exclusive_pages(view) == 2
    tail = stored(kv, 8, *span(3, 2))
    whole = kv.concat(view, tail)
    assert view not in kv and tail not in kv and kv.get(whole).length == 11 and kv.used_pages == 3
    kv.free(whole)
    assert kv.used_pages == 0 and kv.free_pages == 8


def test_a_view_ending_inside_a_page_is_continued_by_copying_its_part_page_and_the_tail():
    kv = arena()
    keys, values = span(10, 3)
    lender = stored(kv, 0, keys, values)  # pages of 4: [0..3] [4..7] [8, 9]
    view = kv.view(lender, 6)  # two pages, the second read only up to position 5
    assert kv.used_pages == 3 and kv.exclusive_pages(view) == 0
    tail_keys, tail_values = span(5, 4)
    tail = stored(kv, 6, tail_keys, tail_values)
    assert kv.continuation_pages(6, 5) == 1 and kv.continuation_pages(8, 5) == 0
    free_before = kv.free_pages
    joined = kv.concat(view, tail)
    assert kv.free_pages == free_before, "the part-page and the tail go to 2 fresh pages; the tail frees its 2"
    assert kv.get(joined).length == 11 and kv.get(joined).start == 0
    k0, v0, _ = read(kv, joined)
    assert torch.equal(k0, torch.cat((keys[0][:, :6], tail_keys[0]), dim=1))
    assert torch.equal(v0, torch.cat((values[0][:, :6], tail_values[0]), dim=1))
    lender_keys, _, _ = read(kv, lender)
    assert torch.equal(lender_keys, keys[0]), "the lender's shared part-page is never written"
    kv.free(lender)
    kv.free(joined)
    assert kv.used_pages == 0


def test_views_and_continuations_are_checked():
    kv = arena()
    block = stored(kv, 0, *span(10, 3))
    with pytest.raises(ValueError, match="1 to 10 tokens"):
        kv.view(block, 11)
    odd = stored(kv, 20, *span(3, 4))
    with pytest.raises(ValueError, match="right after it"):
        kv.concat(odd, stored(kv, 24, *span(2, 5)))


def test_asking_for_more_pages_than_are_free_fails_loudly():
    kv = arena(2)
    stored(kv, 0, *span(5, 6))
    with pytest.raises(ArenaFull, match="2 KV pages asked for, 0 of 2 free"):
        stored(kv, 5, *span(5, 7))


def test_a_budget_in_bytes_becomes_whole_pages():
    per_page = SHAPE.bytes_per_token() * PAGE
    assert KVArena.from_budget(SHAPE, 5.5 * per_page, PAGE, torch.device("cpu")).pages == 5


def memory(pages: int) -> Memory:
    return Memory(arena(pages), RecomputeCost(dense_flops_per_token=1.0, attention_flops_per_pair=0.0))


def test_admission_evicts_the_lowest_priority_kept_entry_first():
    mem = memory(6)
    evicted: list[str] = []
    cheap = stored(mem.arena, 0, *span(8, 8))   # 8 tokens to recompute over 2 pages
    dear = stored(mem.arena, 0, *span(8, 9))
    unlikely = stored(mem.arena, 0, *span(8, 10))
    mem.keep(cheap, 1.0, lambda: evicted.append("cheap"))
    mem.keep(dear, 1.0, lambda: evicted.append("dear"))
    mem.keep(unlikely, 0.1, lambda: evicted.append("unlikely"))
    assert mem.admit(2, busy=True)
    assert evicted == ["unlikely"] and mem.counters.evictions == 1
    mem.pass_ran()
    stored(mem.arena, 0, *span(8, 11))
    assert mem.admit(2, busy=True) and len(evicted) == 2


def test_admission_waits_while_work_is_in_flight_and_refuses_when_nothing_could_ever_fit():
    mem = memory(2)
    stored(mem.arena, 0, *span(8, 12))  # in flight: not evictable
    assert not mem.admit(1, busy=True)
    empty = memory(2)
    with pytest.raises(RefusalError, match="needed 3 pages of 4 tokens, 2 of 2 free"):
        empty.admit(3, busy=False)


def test_entries_sharing_all_their_pages_are_not_worth_evicting():
    mem = memory(3)
    lender = stored(mem.arena, 0, *span(8, 13))
    view = mem.arena.view(lender, 8)
    mem.keep(view, 0.0, lambda: None)
    assert not mem.admit(2, busy=True) and view in mem.arena


def test_model_flops_count_the_keys_each_query_sees_under_a_sliding_window():
    from hypothesis import given
    from hypothesis import strategies as st

    from quail_native.executor.packing import _keys_within

    @given(st.integers(0, 300), st.integers(1, 300), st.integers(1, 200))
    def matches_brute_force(context: int, tokens: int, window: int) -> None:
        assert _keys_within(context, tokens, window) == sum(min(context + j + 1, window) for j in range(tokens))

    matches_brute_force()


def test_model_flops_count_each_layer_row_by_row_with_only_the_read_rows_past_the_last_layers_kv():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from quail_native.executor.packing import item_flops
    from quail_native.models.transformer import Arch

    def arch(window: int | None, last: str) -> Arch:
        kinds = ("sliding", "full", last)
        return Arch(family="gemma3", vocab=50, hidden=8, layers=3, heads=2, kv_heads=1, head_dim=4, ffn=12,
                    norm_eps=1e-6, layer_types=kinds, rope_theta={"full": 1e4, "sliding": 1e4},
                    rope_factor={"full": 1.0, "sliding": 1.0}, sliding_window=window, attention_scale=0.5,
                    activation="gelu_tanh", tied_embeddings=True, embed_scale=None, gemma_norms=True)

    def brute_force(a: Arch, context: int, tokens: int, readout: tuple[int, ...]) -> float:
        q_and_o, kv, mlp = 2 * a.hidden * a.head_dim * a.heads, a.hidden * a.head_dim * a.kv_heads, 3 * a.hidden * a.ffn
        total = 0.0
        for index, kind in enumerate(a.layer_types):
            for row in range(tokens):
                total += 2.0 * 2 * kv
                if index == a.layers - 1 and row not in readout:
                    continue
                keys = context + row + 1
                if kind == "sliding" and a.sliding_window:
                    keys = min(keys, a.sliding_window)
                total += 2.0 * (q_and_o + mlp) + 4.0 * a.heads * a.head_dim * keys
        return total

    @settings(max_examples=200, deadline=None)
    @given(st.integers(0, 40), st.integers(1, 40), st.sampled_from([None, 5, 60]), st.sampled_from(["full", "sliding"]),
           st.data())
    def matches(context: int, tokens: int, window: int | None, last: str, data: st.DataObject) -> None:
        readout = tuple(sorted(data.draw(st.sets(st.integers(0, tokens - 1), max_size=tokens))))
        a = arch(window, last)
        assert item_flops(a, context, tokens, readout) == pytest.approx(brute_force(a, context, tokens, readout))

    matches()
