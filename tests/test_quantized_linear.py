"""The quantized linear kernels (each build: AMX-INT8, AVX512-VNNI, AVX2): the same bits as their torch
reference for every format and M = 1..64, row-invariant, within the quantization's own error of float64, and
column slices equal to the whole matrix's columns. The AMX-INT8 build runs whole 16-row tiles on AMX and the
rest on its VNNI loop, so M = 1..64 crosses that split too."""

from __future__ import annotations

import pytest
import torch

from specdec.models import fast_linear
from specdec.quantization import kernel as quant_kernels
from specdec.quantization import quantized_weight
from specdec.quantization.kernel import QUANT_BUILDS, quant_kernel_build
from specdec.quantization.quantized_weight import QuantizedWeight, pack_tiles
from specdec.quantization.reference import BLOCK, BlockWeights, quantize_activations, reference_linear
from specdec.quantization.weight_quantizers import quantize_int8, quantize_q4_1


def build_or_skip(isa: str):
    """The module of one build, or a skip saying why there is none here."""
    missing = QUANT_BUILDS[isa][2] - fast_linear._cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))} for the {isa} build")
    module = quant_kernel_build(isa)
    if module is None:
        pytest.skip(f"the {isa} build did not compile here (see the warning logged)")
    return module


def use_build(isa: str, monkeypatch) -> str:
    """QuantizedWeight made after this packs for, and runs in, build `isa` (or the test is skipped)."""
    module = build_or_skip(isa)
    monkeypatch.setattr(quantized_weight, "quant_kernel", lambda: module)
    monkeypatch.setattr(quantized_weight, "quant_tile_width", lambda: QUANT_BUILDS[isa][3])
    monkeypatch.setattr(quantized_weight, "quant_kernel_isa", lambda: isa)
    return isa


def assert_every_row_count_equals_the_reference(blocks: BlockWeights, kind_id: int, k: int, n: int) -> None:
    """The build under test's kernel on blocks packed for it (per-column scales, float16 where exact) gives the
    reference's rows for 64 rows one at a time and for every M = 1..64 (the row kinds' tests share this)."""
    tiles = quantized_weight.pack_tiles(blocks, quantized_weight.quant_tile_width(),
                                        half_scales=quantized_weight.halves_exact(blocks), per_column=True)
    module = quantized_weight.quant_kernel()
    x = inputs(64, k, seed=4)
    want = reference_linear(x, blocks)
    alone = torch.cat([module.quant_linear(x[i : i + 1], *tiles, kind_id)[:, :n] for i in range(64)])
    assert torch.equal(alone, want)
    for m in range(1, 65):
        assert torch.equal(module.quant_linear(x[:m], *tiles, kind_id)[:, :n], want[:m]), m


def assert_threads_and_argmax_keep_the_bits(w: QuantizedWeight, x: torch.Tensor, rows: tuple[int, ...]) -> None:
    """w's values on one thread and two, its fused argmax for the first `rows` of x, and its slice maxima all
    give the reference's bits (the row kinds' tests share this)."""
    from specdec.models.greedy_argmax import greedy_argmax

    want = reference_linear(x, w.blocks)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(w.linear_float(x), want)
            for m in rows:
                assert torch.equal(w.greedy_rows(x[:m]), greedy_argmax(want[:m])), (threads, m)
    finally:
        torch.set_num_threads(before)
    values, indices = w.max_columns(x, slice(16, 500))
    assert torch.equal(indices, greedy_argmax(want[:, 16:500]))
    assert torch.equal(values, want[:, 16:500].gather(1, indices[:, None])[:, 0])


@pytest.fixture(params=list(QUANT_BUILDS))
def build(request, monkeypatch) -> str:
    """Runs a test once per build."""
    return use_build(request.param, monkeypatch)


def random_blocks(kind: str, n: int, k: int, seed: int = 0, sub: bool = False) -> BlockWeights:
    g = torch.Generator().manual_seed(seed)
    blocks = k // BLOCK
    scales = torch.rand(n, blocks, generator=g) * 0.01 + 1e-4
    if kind == "s8r":  # w8a8_int8: one scale per column, x per row (tests/test_w8a8_linear.py)
        q = torch.randint(-127, 128, (n, blocks, BLOCK), generator=g, dtype=torch.int8)
        return BlockWeights("s8r", q, scales[:, :1].expand(-1, blocks).contiguous())
    if kind == "u4r":  # int4: integer a and c per group, one scale per column, x per row (tests/test_int4_linear.py)
        q = torch.randint(0, 16, (n, blocks, BLOCK), generator=g, dtype=torch.uint8)
        ints = torch.stack([torch.randint(1, 17, (n, blocks), generator=g),
                            torch.randint(-256, 257, (n, blocks), generator=g)], dim=-1).to(torch.int16)
        return BlockWeights("u4r", q, scales[:, :1].expand(-1, blocks).contiguous() * 0.01, sub_scales=ints)
    if kind == "s8":
        q = torch.randint(-127, 128, (n, blocks, BLOCK), generator=g, dtype=torch.int8)
        subs = torch.randint(-128, 128, (n, blocks, 2), generator=g).to(torch.int16) if sub else None
        if sub:  # Q6_K's range: q - 32 in -32..31
            q = torch.randint(-32, 32, (n, blocks, BLOCK), generator=g, dtype=torch.int8)
        return BlockWeights("s8", q, scales, sub_scales=subs)
    q = torch.randint(0, 16, (n, blocks, BLOCK), generator=g, dtype=torch.uint8)
    return BlockWeights("u4", q, scales, mins=torch.rand(n, blocks, generator=g) * 0.05)


CASES = [("s8", False), ("s8", True), ("u4", False)]


def tied_blocks(kind: str, n: int, k: int, seed: int, sub: bool, top: int, tie: int) -> BlockWeights:
    """random_blocks where column `top` is many rows' maximum and column `tie` (later) ties it exactly."""
    blocks = random_blocks(kind, n, k, seed=seed, sub=sub)
    blocks.scales[top] *= 50
    blocks.q[tie] = blocks.q[top]
    blocks.scales[tie] = blocks.scales[top]
    if blocks.mins is not None:
        blocks.mins[tie] = blocks.mins[top]
    if blocks.sub_scales is not None:
        blocks.sub_scales[tie] = blocks.sub_scales[top]
    return blocks


def inputs(m: int, k: int, seed: int = 1) -> torch.Tensor:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    x[:, :BLOCK] = 0  # an all-zero block: dx = 0 must not divide by zero
    x[0, -1] = 40.0  # an outlier, as Gemma's activations have
    return x.bfloat16()


@pytest.mark.parametrize("kind, sub", CASES)
@pytest.mark.parametrize("n, k", [(8, 32), (13, 96), (200, 640)])
def test_kernel_equals_reference_bit_for_bit(build, kind, sub, n, k):
    w = QuantizedWeight(random_blocks(kind, n, k, sub=sub), k, kind)
    x = inputs(7, k)
    assert torch.equal(w.linear_float(x), reference_linear(x, w.blocks))


@pytest.mark.parametrize("kind, sub", CASES)
def test_every_row_count_equals_the_reference(build, kind, sub):
    """M = 1..64 straight through the build's module (tiles of its width; 44 columns: a partial tile in
    both), against one reference of 64 rows, whose rows do not depend on M."""
    k, n = 640, 44
    blocks = random_blocks(kind, n, k, seed=3, sub=sub)
    tiles = pack_tiles(blocks, QUANT_BUILDS[build][3])
    module = quantized_weight.quant_kernel()
    x = inputs(64, k, seed=4)
    want = reference_linear(x, blocks)
    for m in range(1, 65):
        got = module.quant_linear(x[:m], *tiles, 0 if kind == "s8" else 1)[:, :n]
        assert torch.equal(got, want[:m]), (build, m)


@pytest.mark.parametrize("kind, sub", CASES)
def test_float16_scales_give_the_reference_bits(build, kind, sub):
    """GGUF's scales are float16 values: each build then reads them as float16 tiles (fewer bytes), with the
    bits of the reference for every row count; scales that are not float16 values stay float32."""
    k, n = 640, 44
    blocks = random_blocks(kind, n, k, seed=5, sub=sub)
    assert not quantized_weight.half_exact(blocks.scales)
    assert QuantizedWeight(blocks, k, kind)._tiles[1].dtype == torch.float32
    with pytest.raises(ValueError, match="float16"):
        pack_tiles(blocks, QUANT_BUILDS[build][3], half_scales=True)
    half_mins = None if blocks.mins is None else blocks.mins.half().float()
    if half_mins is not None:  # u4: float16 scales with float32 mins stay float32, both halves or neither
        half_scales_only = BlockWeights(blocks.kind, blocks.q, blocks.scales.half().float(), blocks.mins)
        assert QuantizedWeight(half_scales_only, k, kind)._tiles[1].dtype == torch.float32
    blocks = BlockWeights(blocks.kind, blocks.q, blocks.scales.half().float(), half_mins, blocks.sub_scales)
    w = QuantizedWeight(blocks, k, kind)
    assert w._tiles[1].dtype == torch.float16
    assert half_mins is None or w._tiles[2].dtype == torch.float16
    x = inputs(64, k, seed=6)
    want = reference_linear(x, blocks)
    for m in range(1, 65):
        assert torch.equal(w.linear_float(x[:m]), want[:m]), m
    assert torch.equal(w.linear_rows(x[:5], torch.bfloat16), want[:5].to(torch.bfloat16))


@pytest.mark.parametrize("half", [False, True])
def test_q5_0_quants_in_five_bits_give_the_reference_bits(build, half):
    """s8 quants in -16..15 (GGUF's Q5_0) run in each build's 5-bit layout (kind 2), with the bits of the
    reference for every row count, float32 and float16 scales, a partial tile and a non-finite input."""
    k, n = 640, 44
    g = torch.Generator().manual_seed(8)
    q = torch.randint(-16, 16, (n, k // BLOCK, BLOCK), generator=g, dtype=torch.int8)
    q[0, 0] = -16  # both ends of the range
    q[1, 0] = 15
    scales = torch.rand(n, k // BLOCK, generator=g) * 0.01 + 1e-4
    blocks = BlockWeights("s8", q, scales.half().float() if half else scales)
    w = QuantizedWeight(blocks, k, "Q5_0")
    assert w._kind_id == 2 and w._tiles[0].shape[2] == 5
    assert w._tiles[1].dtype == (torch.float16 if half else torch.float32)
    x = inputs(64, k, seed=9)
    x[3, 100] = float("nan")
    want = reference_linear(x, blocks)
    assert want[3].isnan().all() and not want[2].isnan().any()
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:  # bit for bit, NaN where NaN
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))

    for m in range(1, 65):
        assert same(w.linear_float(x[:m]), want[:m]), m
    assert same(w.linear_columns(x[:4], slice(9, 30)), want[:4, 9:30])
    wide = BlockWeights("s8", torch.cat([q[:, :, :31], torch.full((n, k // BLOCK, 1), 16, dtype=torch.int8)], -1),
                        blocks.scales)  # a 16: not Q5_0's range, so the s8 layout
    assert QuantizedWeight(wide, k, "Q8_0")._kind_id == 0
    with pytest.raises(ValueError, match="s5"):
        pack_tiles(wide, QUANT_BUILDS[build][3], s5=True)


@pytest.mark.parametrize("kind, sub", CASES)
def test_bfloat16_output_and_float32_input_give_the_same_bits(build, kind, sub):
    """linear_rows' bfloat16 output (rounded in the kernel as it stores) is the float32 result rounded by
    torch; a float32 x holding the same values gives the same bits."""
    k, n = 96, 13  # a partial tile: linear_rows trims the padding columns
    w = QuantizedWeight(random_blocks(kind, n, k, sub=sub), k, kind)
    x = inputs(9, k)
    want = w.linear_float(x)
    assert (want.to(torch.bfloat16).float() != want).any()  # the rounding is exercised
    assert torch.equal(w.linear_rows(x, torch.bfloat16).view(torch.int16), want.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(w.linear_rows(x.float(), torch.float32), want)
    assert torch.equal(w.linear_rows(x.double(), torch.float32), want)  # other dtypes are read as float32


def test_bfloat16_output_rounds_exact_ties_to_even_and_nan_to_0x7fc0(build):
    """The kernels' vector bfloat16 stores round as torch does where it is hardest: outputs exactly
    halfway between two bfloat16 values (to the even one), and NaN rows (0x7FC0, as c10::BFloat16).
    Power-of-two scales make every output an exact integer times 2^-13, so many of them are ties."""
    k, n, m = 32, 256, 16
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (n, 1, BLOCK), generator=g, dtype=torch.int8)
    w = QuantizedWeight(BlockWeights("s8r", q, torch.full((n, 1), 2.0**-10)), k, "s8r")
    x = torch.randint(-127, 128, (m, k), generator=g).float() / 8
    x[:, 0] = 127 / 8  # max|x| / 127 = 2^-3 exactly: x quantizes to the integers themselves
    x[5, 3] = float("nan")
    want = w.linear_float(x)
    ties = (want.view(torch.int32) & 0xFFFF) == 0x8000
    assert ties.sum() >= 8 and want[5].isnan().all()
    got = w.linear_rows(x, torch.bfloat16).view(torch.int16)
    finite = torch.arange(m) != 5
    assert torch.equal(got[finite], want[finite].to(torch.bfloat16).view(torch.int16))
    assert (got[5] == 0x7FC0).all()  # c10::BFloat16's NaN (torch's vector conversion gives 0xFFFF)


@pytest.mark.parametrize("kind, sub", CASES + [("s8r", False), ("u4r", False)])
def test_a_non_finite_input_makes_its_row_nan_as_in_the_reference(build, kind, sub):
    """A NaN or an infinity in x has no int8 value: its whole output row is NaN (as the reference's), not a
    finite row that silently dropped it; the other rows keep their bits. (s8r and u4r: the row is one block.)"""
    k, n = 96, 13
    w = QuantizedWeight(random_blocks(kind, n, k, sub=sub), k, kind)
    x = inputs(20, k)  # rows 0-15 a whole tile (AMX where the build has it), 16-19 the rest
    clean = w.linear_float(x)
    x[1, 40] = float("nan")
    x[2, 70] = float("-inf")
    x[17, 5] = float("nan")
    bad, good = [1, 2, 17], [0, 3, 16, 19]
    got, want = w.linear_float(x), reference_linear(x, w.blocks)
    assert want[bad].isnan().all() and got[bad].isnan().all()
    assert torch.equal(got[good], clean[good]) and torch.equal(got[good], want[good])


@pytest.mark.parametrize("kind, sub", CASES)
def test_rows_are_bit_identical_whatever_the_number_of_rows(build, kind, sub):
    k = 640
    w = QuantizedWeight(random_blocks(kind, 64, k, sub=sub), k, kind)
    x = inputs(64, k)
    alone = torch.cat([w.linear_float(x[i : i + 1]) for i in range(64)])
    for m in range(1, 65):
        assert torch.equal(w.linear_float(x[:m]), alone[:m]), m


def test_threads_do_not_change_a_bit(build):
    k = 640
    w = QuantizedWeight(random_blocks("u4", 1000, k), k, "u4")
    x = inputs(37, k)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = w.linear_float(x)
        torch.set_num_threads(2)
        two = w.linear_float(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@pytest.mark.parametrize("kind, sub", CASES)
def test_within_the_activation_quantization_error_of_float64(kind, sub):
    """Against x @ dequant(W).T in float64: each block's activations are rounded to steps of dx, so a row's
    error is at most sum over blocks of dx / 2 * sum |w| (plus float32 rounding)."""
    k = 640
    blocks = random_blocks(kind, 50, k, sub=sub)
    w = QuantizedWeight(blocks, k, kind)
    x = inputs(6, k)
    y = w.linear_float(x).double()
    dense = blocks.dequantize().double()
    exact = x.double() @ dense.T
    dx = quantize_activations(x).dx.double()  # [M, blocks]
    bound = torch.einsum("mb,nb->mn", dx / 2, dense.abs().reshape(50, -1, BLOCK).sum(-1))
    assert ((y - exact).abs() <= bound * 1.001 + 1e-3).all()
    assert (y - exact).abs().max() > 0  # activations really are quantized


@pytest.mark.parametrize("kind", ["s8", "u4"])
def test_column_ranges_and_ids_equal_the_whole_matrix(build, kind):
    k = 96
    w = QuantizedWeight(random_blocks(kind, 101, k), k, kind)
    x = inputs(4, k)
    whole = w.linear_float(x)
    for cols in (slice(0, 101), slice(8, 40), slice(3, 29), slice(96, 101), slice(50, 50)):
        assert torch.equal(w.linear_columns(x, cols), whole[:, cols]), cols
    ids = torch.tensor([100, 0, 57, 57, 9])
    assert torch.equal(w.linear_columns(x, ids), whole[:, ids])


@pytest.mark.parametrize("isa", ["avx512_vnni", "amx_int8"])
def test_avx512_builds_are_exact_at_minus_128(isa):
    """-128 (possible in a foreign Q8_0 file, never from our quantizers) is exact in the AVX512 builds: the
    VNNI loop's q + 128 is 0, and AMX multiplies signed bytes as they are. The AVX2 build's sign trick cannot
    negate it, so this edge is theirs only."""
    module = build_or_skip(isa)
    k = 96
    blocks = random_blocks("s8", 32, k, seed=5)
    blocks.q[:, :, ::3] = -128
    x = inputs(21, k)
    got = module.quant_linear(x, *pack_tiles(blocks, 16), 0)
    assert torch.equal(got, reference_linear(x, blocks))


def test_the_amx_build_runs_every_row_of_a_large_call_on_amx():
    """The AMX-INT8 build's split, so that its tests above do reach AMX: every row of a call (its last row tile
    padded), none below 16 rows (32 for u4); the VNNI-only build none."""
    module = build_or_skip("amx_int8")
    if module.amx_tile_rows(64, 0) == 0:
        pytest.skip("the OS did not grant the AMX tile state")
    rows = (1, 15, 16, 17, 31, 32, 47)
    for kind in (0, 2):  # s8, s5
        assert [module.amx_tile_rows(m, kind) for m in rows] == [0, 0, 16, 17, 31, 32, 47]
    assert [module.amx_tile_rows(m, 1) for m in rows] == [0, 0, 0, 0, 0, 32, 47]
    assert build_or_skip("avx512_vnni").amx_tile_rows(64, 0) == 0


def test_the_best_build_is_chosen_from_the_cpu_flags(monkeypatch):
    vnni = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
    monkeypatch.delenv("SPECDEC_NO_VNNI", raising=False)
    monkeypatch.delenv("SPECDEC_NO_AMX", raising=False)
    monkeypatch.setattr(fast_linear, "_cpu_flags", lambda: vnni | {"amx_tile", "amx_int8"})
    assert quant_kernels.quant_isas() == ["amx_int8", "avx512_vnni", "avx2"]
    monkeypatch.setenv("SPECDEC_NO_AMX", "1")
    assert quant_kernels.quant_isas() == ["avx512_vnni", "avx2"]
    monkeypatch.delenv("SPECDEC_NO_AMX")
    monkeypatch.setattr(fast_linear, "_cpu_flags", lambda: vnni)
    assert quant_kernels.quant_isas() == ["avx512_vnni", "avx2"]
    monkeypatch.setenv("SPECDEC_NO_VNNI", "1")
    assert quant_kernels.quant_isas() == ["avx2"]
    monkeypatch.delenv("SPECDEC_NO_VNNI")
    monkeypatch.setattr(fast_linear, "_cpu_flags", lambda: vnni - {"avx512_vnni"})
    assert quant_kernels.quant_isas() == ["avx2"]
    assert quant_kernels.quant_tile_width("avx512_vnni") == 16 and quant_kernels.quant_tile_width("avx2") == 8


def test_fallback_without_the_kernel_gives_the_same_bits(monkeypatch):
    k = 96
    w = QuantizedWeight(random_blocks("s8", 24, k, sub=True), k, "Q6_K")
    x = inputs(3, k)
    with_kernel = w.linear_float(x)
    monkeypatch.setattr("specdec.quantization.quantized_weight.quant_kernel", lambda: None)
    assert torch.equal(w.linear_float(x), with_kernel)


def test_int8_per_channel_error_is_half_a_step():
    """Half of the stored (float16) step: the quants are rounded against the scale as stored; at the channel's
    largest weight a clamp to 127 costs at most 127 times the scale's float16 rounding, less than half a step."""
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(11))
    b = quantize_int8(w)
    assert b.q.dtype == torch.int8 and int(b.q.abs().max()) <= 127
    step = (w.abs().amax(1, keepdim=True) / 127).half().float()
    assert torch.equal(b.scales[:, :1], step)
    assert ((b.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(b.scales, b.scales[:, :1].expand_as(b.scales))  # one scale per output channel


def test_int4_refinement_never_worse_than_min_max():
    """The float fit int4 starts from (Q4_1's: s and m per group), before its integer rounding."""
    w = torch.randn(64, 128) * torch.rand(64, 1)
    coarse, refined = quantize_q4_1(w, refinements=0), quantize_q4_1(w, refinements=4)
    assert int(refined.q.max()) <= 15
    def group_err(b):
        return (b.dequantize() - w).square().reshape(64, -1, BLOCK).sum(-1)
    assert (group_err(refined) <= group_err(coarse) + 1e-7).all()
    assert group_err(refined).sum() < 0.95 * group_err(coarse).sum()


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_int8(torch.randn(8, 40))
    with pytest.raises(ValueError, match="in_features"):
        QuantizedWeight(random_blocks("s8", 8, 64), 96, "x")
    with pytest.raises(ValueError, match="multiple of 32"):
        reference_linear(torch.randn(2, 40), random_blocks("s8", 8, 64))


def test_int8_and_q4_1_store_float16_scales(build):
    """Our quantizers round scales (and Q4_1's mins) to float16 values before rounding the quants against
    them, so the kernels read 2 bytes each, and the weights stay as close to the float ones as before."""
    w = torch.randn(40, 128, generator=torch.Generator().manual_seed(2)) * 0.05
    for blocks, fmt in ((quantize_int8(w), "int8"), (quantize_q4_1(w), "q4_1")):
        assert quantized_weight.half_exact(blocks.scales)
        assert blocks.mins is None or quantized_weight.half_exact(blocks.mins)
        tiles = QuantizedWeight(blocks, 128, fmt)._tiles
        assert tiles[1].dtype == torch.float16 and (blocks.mins is None or tiles[2].dtype == torch.float16)
        step = (w.abs().amax(1, keepdim=True) / 127) if fmt == "int8" else (w.amax() - w.amin()) / 15
        assert (blocks.dequantize() - w).abs().max() <= step.max() * 0.51


@pytest.mark.parametrize("kind, sub", CASES)
def test_fused_argmax_equals_greedy_argmax_of_the_values(build, kind, sub):
    """quant_linear_argmax is greedy_argmax(linear_float(x)) for M up to 64, on one thread and two, over
    columns that end in a partial tile (its padding is no token): a tie goes to the first column, a row with
    a NaN to its first NaN."""
    from specdec.models.greedy_argmax import greedy_argmax

    k, n = 96, 1003
    w = QuantizedWeight(tied_blocks(kind, n, k, 5, sub, top=40, tie=700), k, kind)
    x = inputs(64, k, seed=6)
    x[3, 50] = float("nan")  # a NaN row: its first column
    values = w.linear_float(x)
    want = greedy_argmax(values)
    assert want[3] == 0 and (want == 40).sum() >= 5 and not (want == 700).any()
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in (1, 2, 5, 16, 64):
                assert torch.equal(w.greedy_rows(x[:m]), want[:m]), (threads, m)
    finally:
        torch.set_num_threads(before)
    lowest = torch.full((2, k), float("-inf"), dtype=torch.bfloat16)  # every value NaN: the first column
    assert torch.equal(w.greedy_rows(lowest), greedy_argmax(w.linear_float(lowest)))
    module = quantized_weight.quant_kernel()
    with pytest.raises(RuntimeError, match="n_valid"):
        module.quant_linear_argmax(x[:1], *w._tiles, w._kind_id, n + 100)


@pytest.mark.parametrize("kind, sub", CASES)
def test_column_maxima_equal_the_argmax_and_value_of_the_columns(build, kind, sub):
    """max_columns (quant_linear_max over the tiles of a column range) gives each row's greedy_argmax of
    linear_columns over that range and the value there, for M up to 16 and ranges that end inside a tile:
    ties to the first column, a NaN row to its first NaN; a range starting inside a tile is left to the
    caller (None)."""
    from specdec.models.greedy_argmax import greedy_argmax

    k, n = 96, 1003
    w = QuantizedWeight(tied_blocks(kind, n, k, 7, sub, top=520, tie=600), k, kind)
    x = inputs(16, k, seed=8)
    x[2, 40] = float("nan")
    width = quantized_weight.quant_tile_width()
    for columns in (slice(0, n), slice(0, 64), slice(512, n), slice(width, 300)):
        values = w.linear_columns(x, columns)
        index = greedy_argmax(values)
        value = values.gather(1, index[:, None])[:, 0]
        assert index[2] == 0 and value[2].isnan()
        if columns.start == 512:
            assert (index == 520 - 512).sum() >= 3 and not (index == 600 - 512).any()
        for m in (1, 3, 16):
            got = w.max_columns(x[:m], columns)
            assert got is not None
            assert torch.equal(got[1], index[:m]), (columns, m)
            assert torch.allclose(got[0], value[:m], rtol=0, atol=0, equal_nan=True)
    assert w.max_columns(x, slice(width + 1, 300)) is None


@pytest.mark.parametrize("half", [False, True])
def test_per_column_scales_give_the_per_block_bits(build, half):
    """int8 per output channel stores one scale per column: each build reads it for every block and gives the
    bits of the per-block layout (and of the reference) for M = 1..64, in fewer bytes; blocks whose scales
    differ (GGUF's Q8_0) keep them per block, and packing them per column is refused."""
    k, n = 640, 44
    g = torch.Generator().manual_seed(8)
    per_channel = (torch.rand(n, 1, generator=g) * 0.01 + 1e-4).expand(n, k // BLOCK).contiguous()
    if half:
        per_channel = per_channel.half().float()
    blocks = BlockWeights("s8", torch.randint(-127, 128, (n, k // BLOCK, BLOCK), generator=g, dtype=torch.int8),
                          per_channel)
    assert quantized_weight.per_column_scales(blocks)
    width = QUANT_BUILDS[build][3]
    by_block = pack_tiles(blocks, width, half_scales=half)
    by_column = pack_tiles(blocks, width, half_scales=half, per_column=True)
    assert by_column[1].shape == (-(-n // width), 1, width) and by_column[1].numel() * (k // BLOCK) == by_block[1].numel()
    module = quantized_weight.quant_kernel()
    x = inputs(64, k, seed=9)
    want = reference_linear(x, blocks)
    for m in (1, 2, 7, 16, 64):
        assert torch.equal(module.quant_linear(x[:m], *by_column, 0)[:, :n], want[:m]), m
        assert torch.equal(module.quant_linear(x[:m], *by_block, 0)[:, :n], want[:m]), m
    w = QuantizedWeight(blocks, k, "int8")
    assert w._tiles[1].shape[1] == 1 and torch.equal(w.linear_float(x), want)
    assert torch.equal(w.greedy_rows(x), want.argmax(-1))
    mixed = BlockWeights("s8", blocks.q, random_blocks("s8", n, k).scales)
    assert not quantized_weight.per_column_scales(mixed)
    with pytest.raises(ValueError, match="per-column"):
        pack_tiles(mixed, width, per_column=True)
    assert QuantizedWeight(mixed, k, "Q8_0")._tiles[1].shape[1] == k // BLOCK
