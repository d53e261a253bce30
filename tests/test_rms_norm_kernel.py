"""The RMSNorm kernel (kernels/avx2_rms_norm.cpp): each row the documented fixed-order arithmetic, whatever
the number of rows, its strides or the ISA; within float32 rounding of torch's F.rms_norm."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specdec.models import fast_linear
from specdec.models.decoder import norm_scale, rms_norm

pytestmark = pytest.mark.skipif(not hasattr(fast_linear.kernel(), "rms_norm_rows"),
                                reason="no rms_norm_rows kernel here (no kernels built)")


def _documented(x: torch.Tensor, scale: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """The kernel's arithmetic in float32 torch ops: 16 lanes of squares, summed pairwise, / D, rsqrt."""
    xf = x.float()
    d = x.shape[-1]
    acc = torch.zeros(*x.shape[:-1], 16)
    for k in range(d):
        acc[..., k % 16] += xf[..., k] * xf[..., k]
    s8 = acc[..., :8] + acc[..., 8:]
    s4 = s8[..., :4] + s8[..., 4:]
    s2 = s4[..., :2] + s4[..., 2:]
    mean = (s2[..., 0] + s2[..., 1]) / torch.tensor(float(d))
    # numpy's float32 sqrt and division are correctly rounded, as the kernel's; torch's vectorised sqrt is
    # not on every CPU (an AVX2-only build gave sqrt(9.668) one ulp low)
    r = torch.from_numpy(np.float32(1.0) / np.sqrt(mean.numpy() + np.float32(eps)))
    h = xf * r[..., None]
    if gemma:
        return (h * scale).to(torch.bfloat16)
    return (scale.float() * h.to(torch.bfloat16).float()).to(torch.bfloat16)


def _torch(x: torch.Tensor, scale: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    h = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return (h * scale).type_as(x) if gemma else scale * h.to(x.dtype)


@pytest.mark.parametrize("gemma", [True, False])
@pytest.mark.parametrize("dim", [640, 256, 40, 7, 1])
def test_each_row_is_the_documented_arithmetic_for_any_row_count(dim, gemma):
    g = torch.Generator().manual_seed(dim)
    x = (torch.randn(33, dim, generator=g) * 3).bfloat16()
    scale = norm_scale(torch.randn(dim, generator=g).bfloat16(), gemma)
    k = fast_linear.kernel()
    got = k.rms_norm_rows(x, scale, 1e-6, gemma)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    assert torch.equal(got, _documented(x, scale, 1e-6, gemma))
    alone = torch.cat([k.rms_norm_rows(x[i : i + 1], scale, 1e-6, gemma) for i in range(33)])
    assert torch.equal(alone, got)
    torch.testing.assert_close(got.float(), _torch(x, scale, 1e-6, gemma).float(), atol=0, rtol=2 ** -7)


def test_strided_heads_with_one_scale_row_per_head():
    """The q/k norm: a slice of the fused qkv rows ([T, heads + kv_heads, D], strided) with a scale per head."""
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(9, 7, 256, generator=g).bfloat16()
    qk = qkv[:, :5]
    scale = torch.cat([norm_scale(torch.randn(256, generator=g), True).expand(4, -1),
                       norm_scale(torch.randn(256, generator=g), True).expand(1, -1)])
    got = fast_linear.kernel().rms_norm_rows(qk, scale, 1e-6, True)
    assert torch.equal(got, _documented(qk, scale, 1e-6, True))
    assert torch.equal(got, rms_norm(qk, scale, 1e-6, True))


def test_nan_and_overflowing_rows():
    x = torch.tensor([[float("nan")] + [1.0] * 20, [3e38] * 21]).bfloat16()
    scale = norm_scale(torch.zeros(21), True)
    got = fast_linear.kernel().rms_norm_rows(x, scale, 1e-6, True)
    assert torch.isnan(got[0]).all()  # a NaN poisons its row (any NaN bits: torch's own vary by path)
    torch.testing.assert_close(got, _documented(x, scale, 1e-6, True), atol=0, rtol=0, equal_nan=True)


def test_the_decoder_uses_the_kernel_without_autograd_and_torch_with_it():
    x = torch.randn(4, 64).bfloat16()
    scale = norm_scale(torch.randn(64), True)
    with torch.no_grad():
        assert torch.equal(rms_norm(x, scale, 1e-6, True), _documented(x, scale, 1e-6, True))
    w = torch.randn(64, requires_grad=True)
    out = rms_norm(x, norm_scale(w, True), 1e-6, True)
    out.float().sum().backward()  # the torch ops: autograd reaches the weight
    assert w.grad is not None


def test_bad_inputs_are_refused():
    k = fast_linear.kernel()
    with pytest.raises(RuntimeError, match="bfloat16"):
        k.rms_norm_rows(torch.randn(2, 8), norm_scale(torch.zeros(8), True), 1e-6, True)
    with pytest.raises(RuntimeError, match="float32"):
        k.rms_norm_rows(torch.randn(2, 8).bfloat16(), torch.ones(8).bfloat16(), 1e-6, True)
    with pytest.raises(RuntimeError, match="scale"):
        k.rms_norm_rows(torch.randn(2, 8).bfloat16(), torch.ones(4), 1e-6, True)
