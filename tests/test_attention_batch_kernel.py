"""The batched attention call (AVX2 build): every sequence's KV write, and every row's output exactly as
decoder.attention gives it for that row alone over the row's attention span (attention_mask.attention_span),
for any mix of chains, trees and prefill chunks, with and without a sliding window."""

from __future__ import annotations

import pytest
import torch

from specdec.models import fast_linear
from specdec.models.attention_mask import (attention_span, build_mask, chain_parents, reorder_mask, tree_ancestry,
                                           tree_slot_order)
from specdec.models.decoder import _NO_ORDER, attention

pytestmark = pytest.mark.skipif(not hasattr(fast_linear.kernel(), "attention_batch"),
                                reason="no attention_batch here (no kernels built)")

HEADS, KV_HEADS, DIM = 4, 2, 32
GROUPS = HEADS // KV_HEADS


def _random_parents(g: torch.Generator, rows: int) -> list[int]:
    return [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, rows)]


def _sequence(g: torch.Generator, rows: int, capacity: int, length: int, tree: bool, window: int | None,
              kv_heads: int = KV_HEADS, dim: int = DIM, groups: int = GROUPS):
    """A cache with `length` committed slots and `rows` new tokens (a chain, or a random tree read in chain
    slot order as runtime.decoder_input builds it): buffers, additive mask, order, positions."""
    keys_t = torch.randn(kv_heads, dim, capacity, generator=g).bfloat16()
    values = torch.randn(kv_heads, capacity, dim, generator=g).bfloat16()
    parents = _random_parents(g, rows) if tree else chain_parents(rows)
    ancestry, depth = tree_ancestry(parents, torch.device("cpu"))
    positions = length + depth
    slot_positions = torch.full((capacity,), -1, dtype=torch.long)
    slot_positions[:length] = torch.arange(length)
    slot_positions[length : length + rows] = positions
    visible = build_mask(slot_positions, length, ancestry, positions, window)
    order = None
    if tree:
        order = tree_slot_order(ancestry, length, capacity)
        visible = reorder_mask(visible, order, depth, length)
    mask = torch.zeros(rows, capacity).masked_fill(~visible, float("-inf")).repeat(groups, 1)
    return keys_t, values, mask, order, positions


def _expected_rows(q, keys_t, values, mask, order, positions, length, window, scale, groups=GROUPS):
    """decoder.attention for each row alone over its span's columns (gathered in the row's slot order)."""
    rows, capacity = q.shape[0], keys_t.shape[2]
    out = []
    for i in range(rows):
        first, end = attention_span(int(positions[i]), capacity, window)
        cols = order[i, first:end] if order is not None else torch.arange(first, end)
        mask_i = mask[[grp * rows + i for grp in range(groups)]][:, first:end]
        out.append(attention(q[i : i + 1], keys_t[:, :, cols], values[:, cols], mask_i, scale))
    return torch.cat(out)


@pytest.mark.parametrize("window", [None, 8, 100])
@pytest.mark.parametrize("seed", range(3))
def test_batched_call_equals_attention_per_row_over_its_span(seed, window):
    g = torch.Generator().manual_seed(seed)
    # (rows, tree): 40 rows runs alone (> 16 rows); lengths up to 560 of 640 slots put spans anywhere
    spans = [(1, False), (6, True), (1, False), (40, False), (3, False), (9, True)]
    rows = sum(r for r, _ in spans)
    q = torch.randn(rows, HEADS, DIM, generator=g).bfloat16()
    k = torch.randn(rows, KV_HEADS, DIM, generator=g).bfloat16()
    v = torch.randn(rows, KV_HEADS, DIM, generator=g).bfloat16()
    seqs, start, all_positions = [], 0, []
    for n, tree in spans:
        length = int(torch.randint(0, 560, (), generator=g))
        keys_t, values, mask, order, positions = _sequence(g, n, 640, length, tree, window)
        seqs.append((start, start + n, length, keys_t, values, mask, order, positions))
        all_positions.append(positions)
        start += n
    expected = []
    for s, e, length, keys_t, values, mask, order, positions in seqs:
        kt, vv = keys_t.clone(), values.clone()
        kt[:, :, length : length + e - s] = k[s:e].permute(1, 2, 0)
        vv[:, length : length + e - s] = v[s:e].transpose(0, 1)
        expected.append((_expected_rows(q[s:e], kt, vv, mask, order, positions, length, window, 0.125), kt, vv))
    got = fast_linear.kernel().attention_batch(
        q, k, v, [x[3] for x in seqs], [x[4] for x in seqs], [x[5] for x in seqs],
        [x[6] if x[6] is not None else _NO_ORDER for x in seqs], [x[0] for x in seqs], [x[1] for x in seqs],
        [x[2] for x in seqs], torch.cat(all_positions), -1 if window is None else window, 0.125)
    for (s, e, _, keys_t, values, _, _, _), (out, kt, vv) in zip(seqs, expected):
        assert torch.equal(got[s:e], out)
        assert torch.equal(keys_t, kt) and torch.equal(values, vv)  # the KV write happened in place


@pytest.mark.parametrize("dim", [256, 80])  # 80: the four-row path's 64 dims, then a row-by-row tail
@pytest.mark.parametrize("window", [None, 100])
def test_decoding_sequences_with_four_query_heads_per_kv_head(dim, window):
    """Gemma 3 270M's decode shape (4 query heads on 1 KV head): the query heads of a sequence run together
    (probs x values four rows at a time) and every sequence prefetches the next one's cache lines; each row
    must still equal decoder.attention alone. 7 sequences: the round-robin over threads and a tail."""
    heads, kv_heads, groups = 4, 1, 4
    g = torch.Generator().manual_seed(dim + (window or 0))
    n = 7
    q = torch.randn(n, heads, dim, generator=g).bfloat16()
    k = torch.randn(n, kv_heads, dim, generator=g).bfloat16()
    v = torch.randn(n, kv_heads, dim, generator=g).bfloat16()
    seqs, expected = [], []
    for i in range(n):
        length = int(torch.randint(0, 300, (), generator=g))
        keys_t, values, mask, _, positions = _sequence(g, 1, 320, length, False, window, kv_heads, dim, groups)
        kt, vv = keys_t.clone(), values.clone()
        kt[:, :, length] = k[i].view(kv_heads, dim)
        vv[:, length] = v[i].view(kv_heads, dim)
        expected.append(_expected_rows(q[i : i + 1], kt, vv, mask, None, positions, length, window, 0.0625, groups))
        seqs.append((keys_t, values, mask, length, positions))
    got = fast_linear.kernel().attention_batch(
        q, k, v, [x[0] for x in seqs], [x[1] for x in seqs], [x[2] for x in seqs], [_NO_ORDER] * n,
        list(range(n)), list(range(1, n + 1)), [x[3] for x in seqs], torch.cat([x[4] for x in seqs]),
        -1 if window is None else window, 0.0625)
    for i in range(n):
        assert torch.equal(got[i : i + 1], expected[i]), i


@pytest.mark.parametrize("rows,tree", [(1, False), (3, False), (4, False), (2, True), (9, True), (16, True)])
@pytest.mark.parametrize("window", [None, 100])
def test_one_decoding_sequence_splits_its_span_and_dims_over_the_threads(rows, tree, window):
    """One sequence's decode step, short chain or verified draft tree (Gemma 3 270M's shape) is one block of
    rows: its span's slots and its values' dims are split over the threads instead. Every row must still
    equal decoder.attention alone, on one thread and on two, over spans from 16 to about 1000 slots: a chain
    with an explicit mask and with the kernel's own, a tree (in tree slot order, on raw pointers like a
    chain) with a contiguous order and with one that is not (the tensor-op path: the same bits)."""
    heads, kv_heads, groups, dim = 4, 1, 4, 256
    g = torch.Generator().manual_seed(rows * 7 + (window or 0) + tree)
    kern = fast_linear.kernel()
    before = torch.get_num_threads()
    try:
        for length in (5, 200, 517, 990):
            q = torch.randn(rows, heads, dim, generator=g).bfloat16()
            k = torch.randn(rows, kv_heads, dim, generator=g).bfloat16()
            v = torch.randn(rows, kv_heads, dim, generator=g).bfloat16()
            keys_t, values, mask, order, positions = _sequence(g, rows, 1024, length, tree, window, kv_heads, dim,
                                                               groups)
            kt, vv = keys_t.clone(), values.clone()
            kt[:, :, length : length + rows] = k.permute(1, 2, 0)
            vv[:, length : length + rows] = v.transpose(0, 1)
            want = _expected_rows(q, kt, vv, mask, order, positions, length, window, 0.0625, groups)
            # (mask, order): a tree's order as built and strided (the same values); a chain's mask or none
            calls = ([(mask, order), (mask, order.t().contiguous().t())] if tree
                     else [(mask, _NO_ORDER), (torch.empty(0), _NO_ORDER)])
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for m, o in calls:
                    got = kern.attention_batch(q, k, v, [keys_t.clone()], [values.clone()], [m], [o], [0],
                                               [rows], [length], positions, -1 if window is None else window,
                                               0.0625)
                    assert torch.equal(got, want), (length, threads, m.numel(), o.is_contiguous())
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("window", [None, 8, 100])
def test_a_chain_without_a_mask_gets_the_mask_build_mask_gives(window):
    """The runtime passes no mask for a chain: the kernel's own (committed slot s holds position s; row i sees
    slots up to its own, within the window) gives the same bits as the explicit one, and a non-chain refuses."""
    g = torch.Generator().manual_seed(3)
    spans = [(1, 0), (5, 37), (1, 300), (20, 120), (3, 511)]  # (rows, committed): a decode, chains, a chunk
    rows = sum(n for n, _ in spans)
    q = torch.randn(rows, HEADS, DIM, generator=g).bfloat16()
    k = torch.randn(rows, KV_HEADS, DIM, generator=g).bfloat16()
    v = torch.randn(rows, KV_HEADS, DIM, generator=g).bfloat16()
    seqs, start = [], 0
    for n, length in spans:
        keys_t, values, mask, _, positions = _sequence(g, n, 640, length, False, window)
        seqs.append((start, start + n, length, keys_t, values, mask, positions))
        start += n
    kern = fast_linear.kernel()

    def call(masks, caches):
        return kern.attention_batch(q, k, v, [c[0] for c in caches], [c[1] for c in caches], masks,
                                    [_NO_ORDER] * len(seqs), [x[0] for x in seqs], [x[1] for x in seqs],
                                    [x[2] for x in seqs], torch.cat([x[6] for x in seqs]),
                                    -1 if window is None else window, 0.125)

    explicit = call([x[5] for x in seqs], [(x[3].clone(), x[4].clone()) for x in seqs])
    implicit = call([torch.empty(0)] * len(seqs), [(x[3].clone(), x[4].clone()) for x in seqs])
    assert torch.equal(explicit, implicit)
    shifted = torch.cat([x[6] for x in seqs]) + 1  # positions that are not the chain after the committed slots
    with pytest.raises(RuntimeError, match="chain"):
        kern.attention_batch(q, k, v, [x[3] for x in seqs], [x[4] for x in seqs], [torch.empty(0)] * len(seqs),
                             [_NO_ORDER] * len(seqs), [x[0] for x in seqs], [x[1] for x in seqs],
                             [x[2] for x in seqs], shifted, -1 if window is None else window, 0.125)


def test_spans_are_shorter_than_the_cache_and_cover_what_a_row_sees():
    """The spans actually cut work (else this kernel would be the whole-buffer one) and never hide a visible
    slot: a window layer's span holds the whole window, a global layer's every slot up to the row."""
    assert attention_span(3000, 4096, 512) == (2480, 3008)  # the window's 512 slots, in whole 16-slot groups
    assert attention_span(3000, 4096, None) == (0, 3008)
    for reach in range(0, 1500, 7):
        for window in (None, 8, 100, 512):
            first, end = attention_span(reach, 1500, window)
            assert end > reach and (window is None and first == 0 or first <= max(0, reach - window + 1))


def test_a_bad_sequence_raises_instead_of_aborting():
    """An error inside the threads comes back as a Python exception (an OpenMP region may not throw)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, HEADS, DIM, generator=g).bfloat16()
    k = torch.randn(2, KV_HEADS, DIM, generator=g).bfloat16()
    keys_t, values, mask, _, _ = _sequence(g, 1, 16, 3, False, None)
    with pytest.raises(RuntimeError):
        fast_linear.kernel().attention_batch(q, k, k, [keys_t, keys_t], [values, values], [mask, mask[:, :5]],
                                             [_NO_ORDER, _NO_ORDER], [0, 1], [1, 2], [3, 3],
                                             torch.tensor([3, 3]), -1, 0.125)


@pytest.mark.skipif(not hasattr(fast_linear.kernel(), "amx_attention_ready"), reason="the AMX build only")
@pytest.mark.parametrize("window", [None, 100])
@pytest.mark.parametrize("rows,tree", [(1, False), (4, False), (40, False), (9, True), (16, True)])
def test_the_caches_tile_layout_gives_the_same_bits(rows, tree, window):
    """On the AMX build the KV cache stores keys slot-major and values dim-major (kv_cache.py's tile layout;
    keys_t and values are views of them) and the tiles read them as stored: every row must equal the call on
    the plain layouts (copied into the tile layout per call), on one thread and on two, for decode steps,
    chains, prefill chunks and trees near the buffer's end; and the new keys and values land in the tile
    layout."""
    heads, kv_heads, groups, dim = 4, 1, 4, 256
    kern = fast_linear.kernel()
    assert kern.amx_attention_ready(dim)
    g = torch.Generator().manual_seed(rows * 5 + (window or 0) + tree)
    before = torch.get_num_threads()
    try:
        for length, capacity in ((3, 64), (200, 1024), (517, 560), (990, 1040)):
            q = torch.randn(rows, heads, dim, generator=g).bfloat16()
            k = torch.randn(rows, kv_heads, dim, generator=g).bfloat16()
            v = torch.randn(rows, kv_heads, dim, generator=g).bfloat16()
            keys_t, values, mask, order, positions = _sequence(g, rows, capacity, length, tree, window, kv_heads,
                                                               dim, groups)
            o = order if tree else _NO_ORDER
            for threads in (1, 2):
                torch.set_num_threads(threads)
                kt, vv = keys_t.clone(), values.clone()
                plain = kern.attention_batch(q, k, v, [kt], [vv], [mask], [o], [0], [rows], [length], positions,
                                             -1 if window is None else window, 0.0625)
                rows_k, vals_t = keys_t.transpose(1, 2).contiguous(), values.transpose(1, 2).contiguous()
                tiled = kern.attention_batch(q, k, v, [rows_k.transpose(1, 2)], [vals_t.transpose(1, 2)], [mask],
                                               [o], [0], [rows], [length], positions,
                                               -1 if window is None else window, 0.0625, [rows_k], [vals_t])
                assert torch.equal(tiled, plain), (length, threads)
                assert torch.equal(rows_k.transpose(1, 2), kt) and torch.equal(vals_t.transpose(1, 2), vv)
    finally:
        torch.set_num_threads(before)
