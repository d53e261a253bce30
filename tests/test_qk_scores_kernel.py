"""The attention scores kernel: float32 q @ keys_t, each element a fixed-order chain over d (on the AMX build,
for head dims that are multiples of 32, the tile unit's sum of 32 dims at a time, as its linears compute it)."""

from __future__ import annotations

import pytest
import torch

from specdec.models import fast_linear

pytestmark = pytest.mark.skipif(not hasattr(fast_linear.kernel(), "qk_scores"),
                                reason="no qk_scores kernel here (no kernels built)")


def _case(heads=2, rows=200, dim=64, slots=77, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, rows, dim, generator=g).bfloat16()
    keys_t = torch.randn(heads, dim, slots, generator=g).bfloat16()
    return q, keys_t


def _chain(q: torch.Tensor, keys_t: torch.Tensor) -> torch.Tensor:
    """float32 chain over d ascending from 0 (bfloat16 products are exact in float32: each FMA is an add)."""
    acc = torch.zeros(q.shape[0], q.shape[1], keys_t.shape[2])
    qf, kf = q.float(), keys_t.float()
    for d in range(q.shape[2]):
        acc = acc + qf[:, :, d, None] * kf[:, None, d, :]
    return acc


@pytest.mark.parametrize("slots", [1, 7, 8, 24, 77, 130])
def test_each_element_is_the_documented_float32_chain(slots):
    q, keys_t = _case(rows=9, dim=40, slots=slots, seed=slots)
    got = fast_linear.kernel().qk_scores(q, keys_t)
    assert got.dtype == torch.float32 and got.shape == (2, 9, slots)
    assert torch.equal(got, _chain(q, keys_t))


@pytest.mark.skipif(fast_linear.kernel_isa() != "amx", reason="the AMX build only")
@pytest.mark.parametrize("dim, slots", [(32, 1), (64, 17), (256, 40), (256, 1600)])
def test_amx_scores_are_the_tile_units_sums(dim, slots):
    """Head dims that are multiples of 32 are scored on tiles: each element has the bits the AMX linear gives
    for q @ keys (one TDPBF16PS per 32 dims in order, from zero), is closer to float64 than the FMA chain's
    bound, and does not depend on the other rows."""
    q, keys_t = _case(rows=37, dim=dim, slots=slots, seed=dim + slots)
    k = fast_linear.kernel()
    got = k.qk_scores(q, keys_t)
    want = torch.stack([k.rows_linear(q[h], keys_t[h].t().contiguous()) for h in range(q.shape[0])])
    assert torch.equal(got, want)
    alone = torch.cat([k.qk_scores(q[:, i : i + 1], keys_t) for i in range(q.shape[1])], dim=1)
    assert torch.equal(alone, got)
    ref = q.double() @ keys_t.double()
    torch.testing.assert_close(got.double(), ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-5)


def test_rows_are_bit_identical_for_any_row_count():
    q, keys_t = _case()
    k = fast_linear.kernel()
    together = k.qk_scores(q, keys_t)
    alone = torch.cat([k.qk_scores(q[:, i : i + 1], keys_t) for i in range(q.shape[1])], dim=1)
    assert torch.equal(alone, together)
    for size in (1, 2, 3, 5, 8, 17, 64, 200):
        parts = torch.cat([k.qk_scores(q[:, i : i + size], keys_t) for i in range(0, q.shape[1], size)], dim=1)
        assert torch.equal(parts, together), size
    ref = q.double() @ keys_t.double()
    torch.testing.assert_close(together.double(), ref, atol=1e-4 * float(ref.abs().max()), rtol=1e-4)


def test_a_view_of_the_cache_buffer_is_read_as_is():
    """The cache hands over keys_t[layer] (contiguous) and q as a reshaped copy; other strides are copied."""
    q, keys_t = _case(rows=5, dim=32, slots=40)
    k = fast_linear.kernel()
    want = k.qk_scores(q, keys_t)
    assert torch.equal(k.qk_scores(q.transpose(1, 2).contiguous().transpose(1, 2), keys_t), want)
    assert torch.equal(k.qk_scores(q, keys_t.transpose(1, 2).contiguous().transpose(1, 2)), want)


def test_bad_shapes_are_refused():
    q, keys_t = _case(rows=3, dim=32, slots=10)
    with pytest.raises(RuntimeError, match="keys_t"):
        fast_linear.kernel().qk_scores(q, keys_t[:, :16])
