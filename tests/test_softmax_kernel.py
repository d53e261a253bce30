"""The attention softmax kernel (kernels/avx2_softmax.cpp): each row the documented arithmetic, the same bits
over any span that holds the row's visible columns (what lets attention spans end at the row), and within
float32 rounding of torch's softmax."""

from __future__ import annotations

import pytest
import torch

from kernel_exp import documented_exp, f32

from specdec.models import fast_linear

pytestmark = pytest.mark.skipif(not hasattr(fast_linear.kernel(), "softmax_rows"),
                                reason="no softmax_rows kernel here (no kernels built)")


def _documented(s: torch.Tensor, first: int) -> torch.Tensor:
    e = documented_exp(s - s.max(dim=-1, keepdim=True).values)
    lanes = torch.zeros(*s.shape[:-1], 16)
    for c in range(s.shape[-1]):
        lanes[..., (first + c) % 16] += e[..., c]
    s8 = lanes[..., :8] + lanes[..., 8:]
    s4 = s8[..., :4] + s8[..., 4:]
    s2 = s4[..., :2] + s4[..., 2:]
    r = f32(1.0) / (s2[..., 0] + s2[..., 1])
    return (e * r[..., None]).to(torch.bfloat16)


def _scores(rows: int, length: int, visible: list[tuple[int, int]], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, length, generator=g) * 4
    for i, (lo, hi) in enumerate(visible):
        s[i, :lo] = float("-inf")
        s[i, hi:] = float("-inf")
    return s


@pytest.mark.parametrize("length,first", [(1, 0), (7, 3), (16, 0), (37, 5), (300, 16), (513, 0), (640, 9)])
def test_each_row_is_the_documented_arithmetic(length, first):
    s = _scores(6, length, [(0, length)] * 6, length)
    out = fast_linear.kernel().softmax_rows(s, first)
    assert out.dtype == torch.bfloat16 and out.shape == s.shape
    assert torch.equal(out.view(torch.int16), _documented(s, first).view(torch.int16))


def test_a_row_has_the_same_bits_over_any_span_that_holds_its_visible_columns():
    k = fast_linear.kernel()
    length = 400
    visible = [(0, 1), (0, 37), (100, 353), (16, 400), (250, 251), (3, 290)]
    s = _scores(len(visible), length, visible, 1)
    whole = k.softmax_rows(s, 0)
    for i, (lo, hi) in enumerate(visible):
        for start in {lo // 16 * 16, 0}:
            for end in {hi, -(-hi // 16) * 16, length}:
                end = min(end, length)
                part = k.softmax_rows(s[i : i + 1, start:end].contiguous(), start)
                assert torch.equal(part[0], whole[i, start:end]), (i, start, end)
                assert not whole[i, :start].any() and not whole[i, end:].any()


def test_close_to_torch_and_nan_rows():
    s = _scores(8, 300, [(0, 300)] * 4 + [(10, 200)] * 4, 2)
    torch.testing.assert_close(fast_linear.kernel().softmax_rows(s, 0).float(), s.softmax(-1), rtol=2 ** -7,
                               atol=1e-7)
    s[0, 5] = float("nan")
    s[1] = float("-inf")  # a row that sees nothing: NaN, as torch gives
    out = fast_linear.kernel().softmax_rows(s, 0)
    assert out[0].isnan().all() and out[1].isnan().all() and not out[2:].isnan().any()
