"""`int4` (kind u4r): 4-bit quants with an integer multiplier and offset per group of 32 on one float scale per
column, activations quantized once per row (optionally after SmoothQuant's per-channel multipliers), so a
row's sum is exact in int32. Each AVX512 build (the AMX-INT8 build's VNNI loop below 6 rows and its AMX tiles
from 6 rows where K is a multiple of 64, and the VNNI-only build) gives the reference's bits for M = 1..64,
row-invariant, and so does the AVX2 build (its own loop, avx2_quant_rows.h); the quantizer keeps the int32
bound and stays close to its float fit. (Non-finite inputs: tests/test_quantized_linear.py.)"""

from __future__ import annotations

import pytest
import torch

from specdec.quantization.quantized_weight import QuantizedWeight
from specdec.quantization.reference import BLOCK, BlockWeights, reference_linear
from specdec.quantization.smoothing import channel_scales
from specdec.quantization.weight_quantizers import (INT4_LEVELS, MAX_INT4_IN_FEATURES, int4_levels, quantize_int4,
                                                   quantize_q4_1)

from test_quantized_linear import (assert_every_row_count_equals_the_reference,
                                   assert_threads_and_argmax_keep_the_bits, build_or_skip, inputs, use_build)

BUILDS = ["amx_int8", "avx512_vnni", "avx2"]


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch) -> str:
    return use_build(request.param, monkeypatch)


def random_int4(n: int, k: int, seed: int = 0, smooth: bool = False) -> BlockWeights:
    """With `smooth`, SmoothQuant's channel scales from made-up activation maxima (a few outlier channels);
    one column all zeros, one with a constant offset (c far from 0)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0] = 0.0
    w[1] = w[1] * 0.01 + 0.3
    if not smooth:
        return quantize_int4(w)
    x_max = torch.rand(k, generator=g) + 0.1
    x_max[::17] *= 40
    return quantize_int4(w, channel_scales=channel_scales(x_max, w))


@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("n, k", [(8, 64), (13, 96), (200, 640), (40, 2048)])
def test_kernel_equals_reference_bit_for_bit(build, n, k, smooth):
    """K = 96 has an odd number of blocks (a pair padded with a zero block; never on AMX tiles)."""
    w = QuantizedWeight(random_int4(n, k, smooth=smooth), k, "int4")
    assert (w.blocks.act_scale is not None) == smooth
    assert w._kind_id == 4 and w.kind == "u4r"
    for m in (7, 16):  # the VNNI loop, and AMX tiles in the AMX build
        x = inputs(m, k)
        assert torch.equal(w.linear_float(x), reference_linear(x, w.blocks))
        assert torch.equal(w.linear_rows(x, torch.bfloat16), reference_linear(x, w.blocks).bfloat16())


@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("k", [640, 96])
def test_every_row_count_equals_the_reference(build, k, smooth):
    n = 44  # a partial tile
    assert_every_row_count_equals_the_reference(random_int4(n, k, seed=3, smooth=smooth), 4, k, n)


def test_extreme_integers_stay_exact(build):
    """a = 16 (a * q = 240, the B operand's largest byte) and |c| = 16 * 16 with full-scale activations: the
    int32 sums stay exact on every path."""
    k = 2048
    n, blocks = 32, k // BLOCK
    q = torch.full((n, blocks, BLOCK), 15, dtype=torch.uint8)
    q[1::2] = 0
    ints = torch.stack([torch.full((n, blocks), 16), torch.full((n, blocks), -256)], -1).to(torch.int16)
    ints[16:, :, 1] = 256
    b = BlockWeights("u4r", q, torch.full((n, blocks), 1e-6), sub_scales=ints)
    x = torch.ones(16, k)
    x[8:] = -1
    want = reference_linear(x, b)
    w = QuantizedWeight(b, k, "int4")
    for m in (1, 16):
        assert torch.equal(w.linear_float(x[:m]), want[:m])
    exact = (b.dequantize().double() @ x.double().T).T
    assert torch.allclose(want.double(), exact, rtol=1e-6)


def test_a_multiplier_beyond_the_levels_is_refused():
    """a * q must stay one unsigned byte for the AMX kernel: a = 17 is refused, not computed wrongly."""
    ints = torch.stack([torch.full((16, 2), 17), torch.zeros(16, 2)], -1).to(torch.int16)
    b = BlockWeights("u4r", torch.zeros(16, 2, BLOCK, dtype=torch.uint8), torch.ones(16, 2), sub_scales=ints)
    with pytest.raises(ValueError, match="0..16"):
        QuantizedWeight(b, 2 * BLOCK, "int4")
    with pytest.raises(ValueError, match="sub_scales"):
        QuantizedWeight(BlockWeights("u4r", b.q, b.scales), 2 * BLOCK, "int4")


def test_threads_and_the_argmax_keep_the_bits(build):
    k, n = 640, 1003
    w = QuantizedWeight(random_int4(n, k, seed=5, smooth=True), k, "int4")
    assert_threads_and_argmax_keep_the_bits(w, inputs(33, k, seed=6), (1, 5, 9, 16, 33))


def test_the_amx_build_runs_calls_of_6_rows_or_more_on_amx():
    module = build_or_skip("amx_int8")
    if module.amx_tile_rows(64, 0) == 0:
        pytest.skip("the OS did not grant the AMX tile state")
    assert [module.amx_tile_rows(m, 4) for m in (1, 5, 6, 16, 33)] == [0, 0, 6, 16, 33]
    assert build_or_skip("avx512_vnni").amx_tile_rows(16, 4) == 0


def test_integer_groups_stay_close_to_the_float_fit():
    """s * (a q - c) against Q4_1's s_g q - m_g: rounding a and c to the column's scale adds little (a up to
    16, each group's a rounded down or up, whichever fits it better), no weight moves much more than a step of
    its group or, in a group whose scale is below the column's s (a = 1), a step of s, and the integers keep
    their bounds."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(64, 640, generator=g) * torch.rand(64, 1, generator=g) * 0.1
    w[:, :32] += 0.2  # groups far from zero: large offsets
    b, fit = quantize_int4(w), quantize_q4_1(w)
    a, c = b.sub_scales[..., 0], b.sub_scales[..., 1]
    assert int(a.min()) >= 1 and int(a.max()) == INT4_LEVELS == 16
    assert int(c.abs().max()) <= 16 * INT4_LEVELS and int(b.q.max()) <= 15
    err = lambda x: (x.dequantize() - w).square().sum()  # noqa: E731
    assert err(b) < 1.05 * err(fit)
    step = fit.scales.repeat_interleave(BLOCK, dim=1)
    s = b.scales.repeat_interleave(BLOCK, dim=1)
    assert ((b.dequantize() - w).abs() <= torch.maximum(step, s) * 2.5 + 1e-6).all()


def test_levels_keep_the_int32_bound_and_too_wide_rows_are_refused():
    for k in (640, 2048, 14336, MAX_INT4_IN_FEATURES):
        levels = int4_levels(k)
        assert 1 <= levels <= INT4_LEVELS and 31 * levels * 127 * k < 2**31
    with pytest.raises(ValueError, match="int32"):
        quantize_int4(torch.zeros(2, MAX_INT4_IN_FEATURES + BLOCK))


def test_smoothing_keeps_the_product():
    """x / t against W * t: the weights the arithmetic stands for stay close to W, and on outlier activations
    the error against float64 is smaller than without smoothing."""
    k, n = 640, 64
    g = torch.Generator().manual_seed(11)
    w = torch.randn(n, k, generator=g) * 0.05
    x = torch.randn(32, k, generator=g)
    x[:, ::40] *= 60
    smoothed = quantize_int4(w, channel_scales=channel_scales(x.abs().amax(0), w))
    assert (smoothed.dequantize() - w).abs().max() < 0.3 * w.abs().max()
    exact = x.double() @ w.double().T
    err = lambda b: (reference_linear(x, b).double() - exact).square().mean()  # noqa: E731
    assert err(smoothed) < err(quantize_int4(w))
    with pytest.raises(ValueError, match="channel_scales"):
        quantize_int4(w, channel_scales=torch.zeros(k))
