"""`w8a8_int8` (kind s8r): int8 weights per column with activations quantized once per row, optionally after
SmoothQuant's per-channel multipliers. Each build (AMX-INT8 for K a multiple of 64, its VNNI loop otherwise,
the VNNI-only build, and the AVX2 build's own loop, avx2_quant_rows.h) gives the reference's bits for
M = 1..64, row-invariant; the error stays within what the row quantization allows. (Non-finite inputs:
tests/test_quantized_linear.py, kind s8r.)"""

from __future__ import annotations

import pytest
import torch

from specdec.quantization.quantized_weight import QuantizedWeight
from specdec.quantization.reference import BLOCK, BlockWeights, reference_linear
from specdec.quantization.smoothing import channel_scales
from specdec.quantization.weight_quantizers import MAX_W8A8_IN_FEATURES, quantize_int8, quantize_w8a8

from test_quantized_linear import (assert_every_row_count_equals_the_reference,
                                   assert_threads_and_argmax_keep_the_bits, build_or_skip, inputs, use_build)

BUILDS = ["amx_int8", "avx512_vnni", "avx2"]


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch) -> str:
    return use_build(request.param, monkeypatch)


def random_w8a8(n: int, k: int, seed: int = 0, smooth: bool = False) -> BlockWeights:
    """With `smooth`, SmoothQuant's channel scales from made-up activation maxima (a few outlier channels)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    if not smooth:
        return quantize_w8a8(w)
    x_max = torch.rand(k, generator=g) + 0.1
    x_max[::17] *= 40
    return quantize_w8a8(w, channel_scales(x_max, w))


@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("n, k", [(8, 64), (13, 96), (200, 640), (40, 2048)])
def test_kernel_equals_reference_bit_for_bit(build, n, k, smooth):
    """K = 96 has an odd number of blocks: the AMX build's VNNI loop runs it; the others run on AMX tiles."""
    w = QuantizedWeight(random_w8a8(n, k, smooth=smooth), k, "w8a8_int8")
    assert (w.blocks.act_scale is not None) == smooth
    assert w._kind_id == 3
    x = inputs(7, k)
    assert torch.equal(w.linear_float(x), reference_linear(x, w.blocks))
    assert torch.equal(w.linear_rows(x, torch.bfloat16), reference_linear(x, w.blocks).bfloat16())


@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("k", [640, 96])
def test_every_row_count_equals_the_reference(build, k, smooth):
    n = 44  # a partial tile
    assert_every_row_count_equals_the_reference(random_w8a8(n, k, seed=3, smooth=smooth), 3, k, n)


def test_threads_and_the_argmax_keep_the_bits(build):
    k, n = 640, 1003
    w = QuantizedWeight(random_w8a8(n, k, seed=5, smooth=True), k, "w8a8_int8")
    assert_threads_and_argmax_keep_the_bits(w, inputs(33, k, seed=6), (1, 5, 16, 33))


def test_the_amx_build_runs_every_row_on_amx():
    module = build_or_skip("amx_int8")
    if module.amx_tile_rows(64, 0) == 0:
        pytest.skip("the OS did not grant the AMX tile state")
    assert [module.amx_tile_rows(m, 3) for m in (1, 7, 16, 33)] == [1, 7, 16, 33]
    assert build_or_skip("avx512_vnni").amx_tile_rows(16, 3) == 0


def test_within_the_row_quantization_error_of_float64():
    """|y - x @ w| <= (dx / 2) * sum |w| per output (each activation moves at most half its row's step), plus
    float32 rounding; and the same weights as int8, whose activations are quantized per block of 32."""
    k, n = 640, 50
    dense = torch.randn(n, k, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 0.05
    blocks = quantize_w8a8(dense.float())
    assert torch.equal(blocks.q, quantize_int8(dense.float()).q)
    x = inputs(16, k).float()
    w = blocks.dequantize().double()
    exact = x.double() @ w.T
    dx = x.abs().amax(1, keepdim=True).double() / 127
    bound = dx / 2 * w.abs().sum(1)[None] + 1e-5 * exact.abs() + 1e-6
    assert ((reference_linear(x, blocks).double() - exact).abs() <= bound).all()


def test_too_wide_rows_are_refused():
    with pytest.raises(ValueError, match="int32"):
        quantize_w8a8(torch.zeros(2, MAX_W8A8_IN_FEATURES + BLOCK))


def test_smoothing_keeps_the_product_and_shrinks_the_activation_range():
    """x @ W.T is kept up to rounding (x / t against W * t), the multiplied activations' outlier channels
    come down, and the error against float64 is smaller than without smoothing on outlier activations."""
    k, n = 640, 64
    g = torch.Generator().manual_seed(11)
    w = torch.randn(n, k, generator=g) * 0.05
    x = torch.randn(32, k, generator=g)
    x[:, ::40] *= 60  # outlier channels, as Gemma's
    t = channel_scales(x.abs().amax(0), w)
    smoothed = quantize_w8a8(w, t)
    assert torch.allclose(smoothed.act_scale, 1 / t)
    # the weights the arithmetic stands for: the quantized columns times act_scale, close to w
    assert (smoothed.dequantize() - w).abs().max() < 0.05 * w.abs().max()
    moved = x * smoothed.act_scale
    assert moved.abs().amax() / moved.abs().median() < x.abs().amax() / x.abs().median() / 4
    exact = x.double() @ w.double().T
    err = lambda b: (reference_linear(x, b).double() - exact).square().mean()  # noqa: E731
    assert err(smoothed) < err(quantize_w8a8(w)) / 2


def test_bad_channel_scales_and_fusing_different_ones_are_refused():
    w = torch.randn(16, 64) * 0.05
    for bad in (torch.zeros(64), torch.full((64,), float("nan")), torch.ones(32)):
        with pytest.raises(ValueError, match="channel_scales"):
            quantize_w8a8(w, bad)
    a = QuantizedWeight(quantize_w8a8(w, torch.ones(64)), 64, "w8a8_int8")
    b = QuantizedWeight(quantize_w8a8(w, torch.full((64,), 2.0)), 64, "w8a8_int8")
    with pytest.raises(ValueError, match="activation scales"):
        QuantizedWeight.concat([a, b])
    assert QuantizedWeight.concat([a, a]).blocks.act_scale is not None
