"""Row independence of the linear layers that decode and verification run through."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec.models import fast_linear


@pytest.fixture
def no_kernel(monkeypatch):
    monkeypatch.setattr(fast_linear, "kernel", lambda: None)


def _case(k: int, n: int, rows: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, k, generator=g) * 2).bfloat16()
    w = (torch.randn(n, k, generator=g) * 0.05).bfloat16()
    b = (torch.randn(n, generator=g) * 0.1).bfloat16()
    return x, w, b


@pytest.mark.parametrize("k,n", [(64, 96), (100, 33), (2048, 640), (640, 1030)])
@pytest.mark.parametrize("with_kernel", [True, False])
def test_rows_do_not_depend_on_how_many_rows_share_the_call(k, n, with_kernel, monkeypatch):
    if not with_kernel:
        monkeypatch.setattr(fast_linear, "kernel", lambda: None)
    elif fast_linear.kernel() is None:
        pytest.skip("no CPU kernel here (neither AVX512-BF16 nor AVX2); the fallback case covers it")
    x, w, b = _case(k, n)
    for fn in (fast_linear.linear, fast_linear.linear_float):
        together = fn(x, w, b)
        for size in (1, 2, 3, 5):
            parts = torch.cat([fn(x[i : i + size], w, b) for i in range(0, x.shape[0], size)])
            assert torch.equal(parts, together), (fn.__name__, size)


def test_kernel_agrees_with_float_reference():
    if fast_linear.kernel() is None:
        pytest.skip("no CPU kernel here")
    x, w, b = _case(2048, 640)
    ref = F.linear(x.float(), w.float(), b.float())
    got = fast_linear.linear_float(x, w, b)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(fast_linear.linear(x, w, b), got.bfloat16())


def test_without_a_kernel_many_rows_use_f_linear(no_kernel):
    x, w, b = _case(64, 32, rows=65)
    assert torch.equal(fast_linear.linear(x, w, b), F.linear(x, w, b))


def _kernel():
    k = fast_linear.kernel()
    if k is None:
        pytest.skip("no CPU kernel here")
    return k


ROW_COUNTS = (1, 2, 3, 5, 8, 17, 64, 97, 99, 100, 101, 200)  # 97-101: the outer product's last 1, 3, 4, 5 rows


@pytest.mark.parametrize("k,n", [(640, 1030), (100, 53), (7, 24), (2048, 97)])
def test_kernel_rows_are_bit_identical_for_any_row_count(k, n):
    """Prefill-sized calls go through the kernel too: a row's bits never depend on M (nor on the blocking
    of the rows that M picks: 4-row blocks, then 3, 2 or 1)."""
    kern = _kernel()
    x, w, _ = _case(k, n, rows=200, seed=1)
    together = kern.rows_linear(x, w)
    alone = torch.cat([kern.rows_linear(x[i : i + 1], w) for i in range(x.shape[0])])
    assert torch.equal(together, alone)
    for size in ROW_COUNTS:
        parts = torch.cat([kern.rows_linear(x[i : i + size], w) for i in range(0, x.shape[0], size)])
        assert torch.equal(parts, together), size
    ref = x.double() @ w.double().T
    torch.testing.assert_close(together.double(), ref, atol=1e-4 * float(ref.abs().max()), rtol=1e-4)


def test_kernel_rows_do_not_depend_on_threads_or_column_slices():
    kern = _kernel()
    x, w, _ = _case(640, 1500, rows=20, seed=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kern.rows_linear(x, w)
        torch.set_num_threads(2)
        two = kern.rows_linear(x, w)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    for start, stop in [(0, 1), (5, 29), (1000, 1500), (3, 1003)]:  # a head slice scores the same bits
        assert torch.equal(kern.rows_linear(x, w[start:stop]), one[:, start:stop])


# 24: the path that splits a tile's weights into float32 once; 100: the outer product (many rows)
@pytest.mark.parametrize("rows", [5, 16, 24, 100])
def test_avx2_kernel_sums_in_its_documented_order(rows):
    """The AVX2 kernel's arithmetic, emulated in float32 (bfloat16 products are exact in float32): per
    chunk of 16 along K, lane l accumulates k = 16j + 2l, then k = 16j + 2l + 1; then the 8 lanes are
    summed as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))."""
    if fast_linear.kernel_isa() != "avx2":
        pytest.skip("not the AVX2 kernel")
    x, w, _ = _case(100, 37, rows=rows, seed=3)
    kp = 112
    xf = F.pad(x.float(), (0, kp - 100)).view(rows, kp // 16, 8, 2)
    wf = F.pad(w.float(), (0, kp - 100)).view(37, kp // 16, 8, 2)
    acc = torch.zeros(rows, 37, 8)
    for j in range(kp // 16):
        for e in range(2):
            acc = acc + xf[:, None, j, :, e] * wf[None, :, j, :, e]
    a = [acc[..., i] for i in range(8)]
    want = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
    assert torch.equal(fast_linear.kernel().rows_linear(x, w), want)


def test_kernel_isa_names_the_build():
    isa = fast_linear.kernel_isa()
    assert (isa is None) == (fast_linear.kernel() is None)
    assert isa in (None, "amx", "avx512_bf16", "avx2")
    if isa is not None:
        assert hasattr(fast_linear.kernel(), "qk_scores")
        assert hasattr(fast_linear.kernel(), "attention_batch")


@pytest.mark.parametrize("k,n", [(640, 96), (33, 40), (2048, 17), (31, 1)])
def test_amx_kernel_tails_and_blocks_agree_with_one_row_at_a_time(k, n):
    """The AMX kernel's padded paths (K not a multiple of 32, N not of 32, fewer than 16 or more than 32
    rows, one or two x tiles per group) give every row the bits it gets alone, and stay near float64."""
    if fast_linear.kernel_isa() != "amx":
        pytest.skip("not the AMX kernel")
    kern = fast_linear.kernel()
    x, w, _ = _case(k, n, rows=70, seed=4)
    together = kern.rows_linear(x, w)
    for i in range(70):
        assert torch.equal(kern.rows_linear(x[i : i + 1], w), together[i : i + 1]), i
    for start in range(0, n, 7):  # a slice that starts inside a 32-row block
        assert torch.equal(kern.rows_linear(x, w[start:]), together[:, start:])
    ref = x.double() @ w.double().T
    torch.testing.assert_close(together.double(), ref, atol=1e-4 * float(ref.abs().max()) + 1e-6, rtol=1e-4)


def test_amx_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("SPECDEC_NO_AMX", "1")
    assert "amx" not in fast_linear._isas()


@pytest.mark.parametrize("with_kernel", [True, False])
def test_no_rows_give_an_empty_result(with_kernel, monkeypatch):
    if not with_kernel:
        monkeypatch.setattr(fast_linear, "kernel", lambda: None)
    elif fast_linear.kernel() is None:
        pytest.skip("no CPU kernel here (neither AVX512-BF16 nor AVX2); the fallback case covers it")
    x, w, b = _case(640, 1030, rows=0)
    for fn in (fast_linear.linear, fast_linear.linear_float):
        assert fn(x, w, b).shape == (0, 1030)


@pytest.mark.parametrize("rows", [1, 20, 150, 200])  # 150, 200: the wide form, with a tail of 22 and 8 rows
@pytest.mark.parametrize("k,n", [(640, 1030), (2048, 97), (100, 53)])
def test_amx_bfloat16_output_is_the_float32_output_rounded_by_torch(rows, k, n):
    """rows_linear_bf16 (what `linear` returns for bfloat16 rows without bias) rounds in the kernel exactly as
    rows_linear(...).to(torch.bfloat16) does, in the transposed and the wide form alike."""
    if fast_linear.kernel_isa() != "amx":
        pytest.skip("not the AMX kernel")
    kern = fast_linear.kernel()
    x, w, _ = _case(k, n, rows=rows, seed=5)
    together = kern.rows_linear(x, w)
    rounded = kern.rows_linear_bf16(x, w)
    assert torch.equal(rounded.view(torch.int16), together.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(fast_linear.linear(x, w), rounded)
    for i in range(0, rows, 37):
        assert torch.equal(kern.rows_linear(x[i : i + 1], w), together[i : i + 1]), i


def test_one_build_can_be_picked_by_name(monkeypatch):
    """SPECDEC_BF16_KERNELS names one build (comparing builds on one CPU); a name that is no build, or that this
    CPU cannot run, is refused with the ones it can."""
    runnable = fast_linear._isas()
    if not runnable:
        pytest.skip("no bf16 kernels on this CPU")
    monkeypatch.setenv("SPECDEC_BF16_KERNELS", runnable[-1])
    assert fast_linear._isas() == [runnable[-1]]
    monkeypatch.setenv("SPECDEC_BF16_KERNELS", "avx1024")
    with pytest.raises(ValueError, match="expected one of amx, avx512_bf16, avx2"):
        fast_linear._isas()
    missing = [isa for isa in fast_linear._BUILDS if isa not in runnable]
    if missing:
        monkeypatch.setenv("SPECDEC_BF16_KERNELS", missing[0])
        with pytest.raises(ValueError, match="this CPU runs only"):
            fast_linear._isas()
