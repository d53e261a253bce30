"""The rotary embedding kernel (kernels/avx2_rope.cpp): the same bits as decoder.apply_rope's torch ops."""

from __future__ import annotations

import pytest
import torch

from specdec.models import fast_linear

pytestmark = pytest.mark.skipif(not hasattr(fast_linear.kernel(), "rope_rows"),
                                reason="no rope_rows kernel here (no kernels built)")


def _torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin


@pytest.mark.parametrize("tokens,groups,dim", [(1, 5, 256), (20, 5, 256), (7, 3, 64), (3, 2, 80), (4, 1, 6)])
def test_same_bits_as_the_torch_ops(tokens, groups, dim):
    g = torch.Generator().manual_seed(dim + tokens)
    qkv = (torch.randn(tokens, groups + 1, dim, generator=g) * 3).to(torch.bfloat16)
    x = qkv[:, :groups]  # strided, as the decoder slices q and k out of qkv
    angles = torch.rand(tokens, 1, dim, generator=g) * 6
    cos = angles.cos().to(torch.bfloat16)
    sin = angles.sin().to(torch.bfloat16)
    out = fast_linear.kernel().rope_rows(x, cos, sin)
    assert out.is_contiguous() and torch.equal(out.view(torch.int16), _torch_rope(x, cos, sin).view(torch.int16))


def test_nan_and_bad_shapes():
    x = torch.zeros(2, 1, 32, dtype=torch.bfloat16)
    x[0, 0, 3] = float("nan")
    cos = torch.ones(2, 1, 32, dtype=torch.bfloat16)
    out = fast_linear.kernel().rope_rows(x, cos, cos)
    assert out[0, 0, 3].isnan() and out[0, 0, 19].isnan() and not out[1].isnan().any()
    with pytest.raises(RuntimeError, match="one cos and sin row per token"):
        fast_linear.kernel().rope_rows(x, cos[:1], cos[:1])
