"""The attention probs @ values kernel: per-row slot order without copies, row-independent results."""

from __future__ import annotations

import pytest
import torch
from specdec.models import fast_linear

pytestmark = pytest.mark.skipif(fast_linear.kernel() is None, reason="no CPU kernel here (AVX512-BF16 or AVX2)")


def _case(heads=2, tokens=3, groups=2, slots=40, dim=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(heads, groups * tokens, slots, generator=g)
    scores[..., slots // 2 :] = float("-inf")  # masked slots: zero probabilities
    probs = scores.softmax(-1).bfloat16()
    values = torch.randn(heads, slots, dim, generator=g).bfloat16()
    return probs, values


def test_matches_torch_within_rounding():
    probs, values = _case()
    got = fast_linear.kernel().probs_values(probs, values, torch.empty(0, dtype=torch.long), 3)
    want = torch.matmul(probs.float(), values.float())
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_a_row_is_the_same_alone_or_with_others():
    probs, values = _case(tokens=4, groups=1)
    k, none = fast_linear.kernel(), torch.empty(0, dtype=torch.long)
    together = k.probs_values(probs, values, none, 4)
    for r in range(4):
        alone = k.probs_values(probs[:, r : r + 1], values, none, 1)
        assert torch.equal(alone[:, 0], together[:, r])


def test_order_reads_the_slots_it_names_bit_exactly():
    probs, values = _case(tokens=3, groups=2, dim=16)
    slots = probs.shape[-1]
    order = torch.stack([torch.randperm(slots, generator=torch.Generator().manual_seed(i)) for i in range(3)])
    k = fast_linear.kernel()
    got = k.probs_values(probs, values, order, 3)
    for row in range(probs.shape[1]):
        gathered = values[:, order[row % 3]]  # the copy torch's path makes
        want = k.probs_values(probs[:, row : row + 1], gathered, torch.empty(0, dtype=torch.long), 1)
        assert torch.equal(got[:, row], want[:, 0])


def _chain(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in float32: per output element a chain over s ascending, skipping zero
    probabilities (bfloat16 products are exact in float32, so each FMA is one float32 add), then rounded to
    bfloat16 to nearest even."""
    acc = torch.zeros(probs.shape[0], probs.shape[1], values.shape[2])
    p, v = probs.float(), values.float()
    for s in range(probs.shape[2]):
        term = p[:, :, s, None] * v[:, None, s, :]
        acc = torch.where(p[:, :, s, None] != 0, acc + term, acc)
    return acc.bfloat16()


@pytest.mark.parametrize("dim", [16, 20, 64, 72, 256])
def test_each_element_is_the_documented_float32_chain(dim):
    probs, values = _case(heads=2, tokens=3, groups=2, slots=33, dim=dim, seed=dim)
    got = fast_linear.kernel().probs_values(probs, values, torch.empty(0, dtype=torch.long), 3)
    assert torch.equal(got, _chain(probs, values))


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 17, 64])
def test_rows_are_bit_identical_for_any_row_count(rows):
    probs, values = _case(heads=2, tokens=64, groups=1, slots=50, dim=40, seed=7)
    k, none = fast_linear.kernel(), torch.empty(0, dtype=torch.long)
    together = k.probs_values(probs, values, none, 64)
    parts = torch.cat([k.probs_values(probs[:, i : i + rows], values, none, probs[:, i : i + rows].shape[1])
                       for i in range(0, 64, rows)], dim=1)
    assert torch.equal(parts, together)


def test_ordered_rows_equal_an_explicit_gather():
    probs, values = _case(heads=2, tokens=4, groups=3, slots=37, dim=24, seed=5)
    slots = probs.shape[-1]
    order = torch.stack([torch.randperm(slots, generator=torch.Generator().manual_seed(i)) for i in range(4)])
    got = fast_linear.kernel().probs_values(probs, values, order, 4)
    for row in range(probs.shape[1]):
        assert torch.equal(got[:, row : row + 1], _chain(probs[:, row : row + 1], values[:, order[row % 4]]))


@pytest.mark.skipif(fast_linear.kernel_isa() != "amx", reason="the AMX build only")
@pytest.mark.parametrize("dim, slots", [(32, 5), (64, 77), (256, 300)])
def test_amx_values_are_the_tile_units_sums_in_chunks_of_32_columns(dim, slots):
    """Head dims that are multiples of 32 run on tiles: each output has the bits the AMX linear gives for
    probs @ values (one TDPBF16PS per 32 columns in order, from zero), rounded to bfloat16; a row alone gets
    the same bits; ordered rows equal the same sums over their gathered values (a tree node's order)."""
    probs, values = _case(heads=2, tokens=5, groups=4, slots=slots, dim=dim, seed=dim)
    k, none = fast_linear.kernel(), torch.empty(0, dtype=torch.long)
    got = k.probs_values(probs, values, none, 5)
    want = torch.stack([k.rows_linear(probs[h], values[h].t().contiguous()) for h in range(2)]).bfloat16()
    assert torch.equal(got, want)
    alone = torch.cat([k.probs_values(probs[:, r : r + 1], values, none, 1) for r in range(probs.shape[1])], dim=1)
    assert torch.equal(alone, got)
    order = torch.stack([torch.randperm(slots, generator=torch.Generator().manual_seed(i)) for i in range(5)])
    ordered = k.probs_values(probs, values, order, 5)
    for row in range(probs.shape[1]):
        gathered = values[:, order[row % 5]].contiguous()
        assert torch.equal(ordered[:, row : row + 1], k.probs_values(probs[:, row : row + 1], gathered, none, 1))


def test_bad_shapes_are_refused():
    probs, values = _case()
    with pytest.raises(RuntimeError, match="order"):
        fast_linear.kernel().probs_values(probs, values, torch.zeros(2, 5, dtype=torch.long), 3)


@pytest.mark.skipif(fast_linear.kernel_isa() != "amx", reason="the AMX build only")
@pytest.mark.parametrize("tail", [0, 5, 40])
def test_amx_tree_orders_permuted_within_a_chunk_equal_an_explicit_gather(tail):
    """A verified tree's rows read the context in slot order and their own few slots permuted: the chunks
    holding those read each dim's values by one word permute (amx_probs_values.cpp), the columns past the
    span as zeros. Bit-identical to the same sums over explicitly gathered values."""
    tokens, tree0, tree = 5, 200, 16
    slots = tree0 + tree + tail
    g = torch.Generator().manual_seed(tail)
    probs = torch.randn(2, 4 * tokens, slots, generator=g).softmax(-1).bfloat16()
    values = torch.randn(2, slots + 64, 256, generator=g).bfloat16()  # room past the span, as a cache has
    order = torch.arange(slots).repeat(tokens, 1)
    for t in range(1, tokens):
        order[t, tree0 : tree0 + tree] = tree0 + torch.randperm(tree, generator=g)
    k, none = fast_linear.kernel(), torch.empty(0, dtype=torch.long)
    full = torch.cat([order, torch.arange(slots, slots + 64).repeat(tokens, 1)], dim=1)  # the unread slots
    ordered = k.probs_values(torch.nn.functional.pad(probs, (0, 64)), values, full, tokens)
    for row in range(probs.shape[1]):
        gathered = values[:, order[row % tokens]].contiguous()
        assert torch.equal(ordered[:, row : row + 1], k.probs_values(probs[:, row : row + 1], gathered, none, 1))
