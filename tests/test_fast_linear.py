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
        pytest.skip("this CPU has no AVX512-BF16 kernel; the fallback case covers it")
    x, w, b = _case(k, n)
    for fn in (fast_linear.linear, fast_linear.linear_float):
        together = fn(x, w, b)
        for size in (1, 2, 3, 5):
            parts = torch.cat([fn(x[i : i + size], w, b) for i in range(0, x.shape[0], size)])
            assert torch.equal(parts, together), (fn.__name__, size)


def test_kernel_agrees_with_float_reference():
    if fast_linear.kernel() is None:
        pytest.skip("no AVX512-BF16 kernel on this CPU")
    x, w, b = _case(2048, 640)
    ref = F.linear(x.float(), w.float(), b.float())
    got = fast_linear.linear_float(x, w, b)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(fast_linear.linear(x, w, b), got.bfloat16())


def test_prefill_sized_calls_use_f_linear(no_kernel):
    x, w, b = _case(64, 32, rows=fast_linear.MAX_KERNEL_ROWS + 1)
    assert torch.equal(fast_linear.linear(x, w, b), F.linear(x, w, b))


@pytest.mark.parametrize("with_kernel", [True, False])
def test_no_rows_give_an_empty_result(with_kernel, monkeypatch):
    if not with_kernel:
        monkeypatch.setattr(fast_linear, "kernel", lambda: None)
    elif fast_linear.kernel() is None:
        pytest.skip("this CPU has no AVX512-BF16 kernel; the fallback case covers it")
    x, w, b = _case(640, 1030, rows=0)
    for fn in (fast_linear.linear, fast_linear.linear_float):
        assert fn(x, w, b).shape == (0, 1030)
