"""Weights packed once (fast_linear.pack_weight) in the AMX tile layout (kernels/amx_packed_linear.cpp), on
AVX512-BF16 CPUs in 16-column panels (kernels/bf16_packed_linear.cpp) or, on AVX2 CPUs, in lane panels
(kernels/avx2_lane_panels_linear.cpp): the bits of the dense kernel for every shape, tail and row count, and a
packed copy that is never used once its weight has changed."""

from __future__ import annotations

import pytest
import torch

from specdec.models import fast_linear

amx = pytest.mark.skipif(fast_linear.kernel_isa() != "amx", reason="the AMX kernels' packing")
lanes = pytest.mark.skipif(fast_linear.kernel_isa() != "avx2", reason="the AVX2 kernels' packing")
panels = pytest.mark.skipif(fast_linear.kernel_isa() != "avx512_bf16", reason="the AVX512-BF16 kernels' packing")
packs = pytest.mark.skipif(fast_linear.kernel_isa() is None, reason="no packed weights here")


@amx
@pytest.mark.parametrize("m,k,n", [(1, 640, 1536), (5, 64, 70), (16, 100, 33), (17, 640, 4097), (33, 96, 40),
                                   (150, 2048, 97), (200, 640, 1030), (64, 7, 24)])
def test_packed_weights_give_the_dense_kernels_bits(m: int, k: int, n: int) -> None:
    kern = fast_linear.kernel()
    torch.manual_seed(m + k + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    packed = kern.amx_pack_weight(w)
    assert torch.equal(kern.amx_packed_linear(x, packed, n, False), kern.rows_linear(x, w))
    assert torch.equal(kern.amx_packed_linear(x, packed, n, True).view(torch.int16),
                       kern.rows_linear(x, w).to(torch.bfloat16).view(torch.int16))
    alone = torch.cat([kern.amx_packed_linear(x[i : i + 1], packed, n, False) for i in range(m)])
    assert torch.equal(alone, kern.rows_linear(x, w))


@lanes
@pytest.mark.parametrize("k,n", [(640, 1536), (64, 70), (100, 33), (2048, 97), (7, 24), (96, 8)])
@pytest.mark.parametrize("m", [1, 4, 5, 7, 8, 13, 14, 20, 64, 95, 150])  # 7, 8, 13, 14: blocks of 4 + 3 and 4 + 4
def test_lane_panels_give_the_dense_kernels_bits(m: int, k: int, n: int) -> None:
    kern = fast_linear.kernel()
    torch.manual_seed(m + k + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    packed = kern.lane_panel_pack(w)
    together = kern.lane_panel_linear(x, w, packed)
    assert torch.equal(together, kern.rows_linear(x, w))
    alone = torch.cat([kern.lane_panel_linear(x[i : i + 1], w, packed) for i in range(m)])
    assert torch.equal(alone, together)


@lanes
def test_lane_panels_are_used_and_their_layout_is_the_documented_one() -> None:
    """A panel holds 16 columns, [8 lanes][kp / 8 steps][16]; step t = 2j + e of lane l holds k = 16j + 2l + e,
    columns c < 8 at 2c and c >= 8 at 2(c - 8) + 1. A packed copy that is not w's gives other numbers (the
    panels are read, not w), with 5 rows and more."""
    kern = fast_linear.kernel()
    n, k = 20, 40
    w = torch.arange(n * k, dtype=torch.float32).view(n, k).bfloat16()
    packed = kern.lane_panel_pack(w).view(2, 8, 48 // 8, 16)  # kp = 48
    for c, col in ((0, 0), (5, 10), (8, 1), (15, 15), (19, 6)):
        for kk in (0, 3, 17, 39):
            j, l, e = kk // 16, kk % 16 // 2, kk % 2
            assert packed[c // 16, l, 2 * j + e, col] == w[c, kk]
    assert packed[1, :, :, 8:].eq(0).all() and packed[:, 4:, 4:, :].eq(0).all()  # columns past 20, k past 40
    other = kern.lane_panel_pack(torch.randn(n, k).bfloat16())
    x = torch.randn(5, k).bfloat16()
    assert not torch.equal(kern.lane_panel_linear(x, w, other), kern.rows_linear(x, w))
    assert torch.equal(kern.lane_panel_linear(x[:4], w, other), kern.rows_linear(x[:4], w))  # 4 rows: w itself


@panels
@pytest.mark.parametrize("k,n", [(640, 1536), (64, 70), (100, 33), (2048, 97), (7, 24), (33, 17), (1, 5)])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7, 12, 13, 64, 150])  # blocks of 6 rows and their tails
def test_bf16_panels_give_the_dense_kernels_bits(m: int, k: int, n: int) -> None:
    """The dense kernel packs its panels as it goes (bf16_rows_linear.cpp): the same bits as packed once,
    for each row alone, and within float32 rounding of a float64 product."""
    kern = fast_linear.kernel()
    torch.manual_seed(m + k + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    packed = kern.pack_bf16_panels(w)
    together = kern.packed_rows_linear(x, packed, n, 0, n)
    assert torch.equal(together, kern.rows_linear(x, w))
    alone = torch.cat([kern.rows_linear(x[i : i + 1], w) for i in range(m)])
    assert torch.equal(alone, together)
    assert torch.equal(kern.packed_rows_linear(x, packed, n, n // 3, n), together[:, n // 3 :])
    exact = x.double() @ w.double().T
    assert ((together.double() - exact).abs() <= 1e-5 * (x.double().abs() @ w.double().abs().T) + 1e-30).all()


@panels
def test_bf16_panels_layout_is_the_documented_one() -> None:
    """Panel b, pair p holds columns 16b..16b+15's values k = 2p, 2p + 1 (column c at 2c, 2c + 1), zeros past N
    and K; a packed copy that is not w's gives other numbers (the panels are read, not w)."""
    kern = fast_linear.kernel()
    n, k = 20, 37
    w = torch.arange(n * k, dtype=torch.float32).view(n, k).bfloat16()
    packed = kern.pack_bf16_panels(w)
    assert packed.shape == (2, 19, 32)
    for c in (0, 5, 15, 16, 19):
        for kk in (0, 3, 17, 36):
            assert packed[c // 16, kk // 2, 2 * (c % 16) + kk % 2] == w[c, kk]
    assert packed[1, :, 8:].eq(0).all() and packed[:, 18, 1::2].eq(0).all()  # columns past 20, k = 37
    x = torch.randn(3, k).bfloat16()
    other = kern.pack_bf16_panels(torch.randn(n, k).bfloat16())
    assert not torch.equal(kern.packed_rows_linear(x, other, n, 0, n), kern.rows_linear(x, w))
    with pytest.raises(RuntimeError, match="pack_bf16_panels"):
        kern.packed_rows_linear(torch.randn(2, 40).bfloat16(), packed, n, 0, n)


@lanes
def test_lane_panels_of_another_shape_are_refused() -> None:
    kern = fast_linear.kernel()
    packed = kern.lane_panel_pack(torch.randn(40, 64).bfloat16())
    with pytest.raises(RuntimeError, match="lane_panel_pack"):
        kern.lane_panel_linear(torch.randn(8, 80).bfloat16(), torch.randn(40, 80).bfloat16(), packed)


@packs
def test_a_packed_copy_is_dropped_when_its_weight_changes() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 96).bfloat16()
    x = torch.randn(6, 96).bfloat16()
    dense = lambda: fast_linear.kernel().rows_linear(x, w).to(torch.bfloat16)  # noqa: E731
    assert fast_linear.pack_weight(w)
    assert fast_linear.packed_copy(w) is not None
    before = fast_linear.linear(x, w)
    assert torch.equal(before, dense())
    w.mul_(2)  # in place: the packed copy is stale
    assert fast_linear.packed_copy(w) is None
    assert torch.equal(fast_linear.linear(x, w), dense())
    assert not torch.equal(fast_linear.linear(x, w), before)


@amx
def test_bad_shapes_are_refused() -> None:
    kern = fast_linear.kernel()
    packed = kern.amx_pack_weight(torch.randn(40, 64).bfloat16())
    with pytest.raises(RuntimeError, match="K does not match"):
        kern.amx_packed_linear(torch.randn(2, 96).bfloat16(), packed, 40, True)
    with pytest.raises(RuntimeError, match="n_size"):
        kern.amx_packed_linear(torch.randn(2, 64).bfloat16(), packed, 100, True)


@packs
def test_the_decoder_packs_its_linears_and_gets_the_same_tokens(zoo) -> None:
    loaded = zoo.load("wide_llama")
    layer = loaded.decoder.layers[0]
    assert all(fast_linear.packed_copy(getattr(layer, name).weight) is not None for name in ("qkv", "o", "gate_up", "down"))
    runtime = loaded.new_runtime()
    runtime.reset(64)
    packed = runtime.forward([3, 9, 4, 7, 1] * 8, logit_rows="all").logits
    fast_linear._PACKED.clear()
    runtime.reset(64)
    dense = runtime.forward([3, 9, 4, 7, 1] * 8, logit_rows="all").logits
    assert torch.equal(packed, dense)
    loaded.decoder.prepare()  # packs again for the other tests
