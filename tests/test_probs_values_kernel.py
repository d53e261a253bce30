"""The attention probs @ values kernel: per-row slot order without copies, row-independent results."""

from __future__ import annotations

import pytest
import torch
from specdec.models import fast_linear

pytestmark = pytest.mark.skipif(fast_linear.kernel() is None, reason="no AVX512-BF16 kernel on this CPU")


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


def test_bad_shapes_are_refused():
    probs, values = _case()
    with pytest.raises(RuntimeError, match="order"):
        fast_linear.kernel().probs_values(probs, values, torch.zeros(2, 5, dtype=torch.long), 3)
