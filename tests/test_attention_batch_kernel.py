"""The batched attention call (AVX2 build): every sequence's KV write and output exactly as
decoder.attention gives them one sequence at a time, for any mix of chains, trees and prefill chunks."""

from __future__ import annotations

import pytest
import torch

from specdec.models import fast_linear
from specdec.models.decoder import _NO_ORDER, attention

pytestmark = pytest.mark.skipif(not hasattr(fast_linear.kernel(), "attention_batch"),
                                reason="no attention_batch here (only the AVX2 build has one)")

HEADS, KV_HEADS, DIM = 4, 2, 32


def _sequence(g: torch.Generator, rows: int, capacity: int, length: int, tree: bool):
    keys_t = torch.randn(KV_HEADS, DIM, capacity, generator=g).bfloat16()
    values = torch.randn(KV_HEADS, capacity, DIM, generator=g).bfloat16()
    visible = torch.rand(rows, capacity, generator=g) < 0.7
    visible[:, 0] = True
    visible[:, length + rows :] = False
    mask = torch.zeros(rows, capacity).masked_fill(~visible, float("-inf")).repeat(HEADS // KV_HEADS, 1)
    order = torch.stack([torch.randperm(capacity, generator=g) for _ in range(rows)]) if tree else None
    if order is not None:
        mask = mask.gather(-1, order.repeat(HEADS // KV_HEADS, 1))
    return keys_t, values, mask, order


@pytest.mark.parametrize("seed", range(4))
def test_batched_call_equals_attention_per_sequence(seed):
    g = torch.Generator().manual_seed(seed)
    spans = [(1, False), (6, True), (1, False), (40, False), (3, False), (5, True)]  # 40: runs alone (> 16 rows)
    rows = sum(r for r, _ in spans)
    q = torch.randn(rows, HEADS, DIM, generator=g).bfloat16()
    k = torch.randn(rows, KV_HEADS, DIM, generator=g).bfloat16()
    v = torch.randn(rows, KV_HEADS, DIM, generator=g).bfloat16()
    seqs, start = [], 0
    for n, tree in spans:
        length = int(torch.randint(0, 20, (), generator=g))
        seqs.append((start, start + n, length, *_sequence(g, n, 64, length, tree)))
        start += n
    expected = []
    for s, e, length, keys_t, values, mask, order in seqs:
        kt, vv = keys_t.clone(), values.clone()
        kt[:, :, length : length + e - s] = k[s:e].permute(1, 2, 0)
        vv[:, length : length + e - s] = v[s:e].transpose(0, 1)
        expected.append((attention(q[s:e], kt, vv, mask, 0.125, order), kt, vv))
    got = fast_linear.kernel().attention_batch(
        q, k, v, [x[3] for x in seqs], [x[4] for x in seqs], [x[5] for x in seqs],
        [x[6] if x[6] is not None else _NO_ORDER for x in seqs], [x[0] for x in seqs], [x[1] for x in seqs],
        [x[2] for x in seqs], 0.125)
    for (s, e, _, keys_t, values, _, _), (out, kt, vv) in zip(seqs, expected):
        assert torch.equal(got[s:e], out)
        assert torch.equal(keys_t, kt) and torch.equal(values, vv)  # the KV write happened in place


def test_a_bad_sequence_raises_instead_of_aborting():
    """An error inside the threads comes back as a Python exception (an OpenMP region may not throw)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, HEADS, DIM, generator=g).bfloat16()
    k = torch.randn(2, KV_HEADS, DIM, generator=g).bfloat16()
    keys_t, values, mask, _ = _sequence(g, 1, 16, 3, False)
    with pytest.raises(RuntimeError):
        fast_linear.kernel().attention_batch(q, k, k, [keys_t, keys_t], [values, values], [mask, mask[:, :5]],
                                             [_NO_ORDER, _NO_ORDER], [0, 1], [1, 2], [3, 3], 0.125)
