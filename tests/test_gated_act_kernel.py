"""The gated-MLP activation kernel (kernels/avx2_gated_act.cpp): every value the documented float32
arithmetic (so the AVX512 body, the AVX2 loop and the padded tail agree), whatever the row count or the
width; close to torch's gelu(tanh) * up and silu * up; and the decoder uses it where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_exp import documented_exp, f32

from specdec.models import fast_linear
from specdec.models.gated_activation import gated_activation

pytestmark = pytest.mark.skipif(not hasattr(fast_linear.kernel(), "gated_act_mul"),
                                reason="no gated_act_mul kernel here (no kernels built)")


def _documented(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """The kernel's arithmetic as float32 torch ops, one IEEE operation at a time."""
    n = gate_up.shape[-1] // 2
    g, u = gate_up[..., :n].float(), gate_up[..., n:].float()
    if gelu:
        z = ((g * g) * g) * f32(0.044715)
        z = (z + g) * f32(-1.5957691216)
    else:
        z = -g
    return ((g / (f32(1.0) + documented_exp(z))) * u).to(torch.bfloat16)


@pytest.mark.parametrize("gelu", [True, False])
@pytest.mark.parametrize("rows,width", [(1, 2048), (3, 24), (5, 37), (20, 2048), (2, 7), (64, 130)])
def test_each_value_is_the_documented_arithmetic(gelu, rows, width):
    torch.manual_seed(rows * 1000 + width)
    gate_up = (torch.randn(rows, 2 * width) * 3).to(torch.bfloat16)
    out = gated_activation(gate_up, "gelu_tanh" if gelu else "silu")
    assert out.shape == (rows, width) and out.dtype == torch.bfloat16
    assert torch.equal(out.view(torch.int16), _documented(gate_up, gelu).view(torch.int16))
    # a row alone gives the same bits as inside the batch
    assert torch.equal(gated_activation(gate_up[-1:], "gelu_tanh" if gelu else "silu"), out[-1:])


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu"])
def test_close_to_torch(activation):
    torch.manual_seed(0)
    gate_up = (torch.randn(64, 2 * 512) * 4).to(torch.bfloat16)
    gate, up = gate_up.float().chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh") if activation == "gelu_tanh" else F.silu(gate)
    expected = act * up  # float32: the kernel rounds once, so it is within half a bfloat16 ulp of this
    out = gated_activation(gate_up, activation).float()
    torch.testing.assert_close(out, expected, rtol=2 ** -8, atol=1e-5)  # near 0 torch's 1 + tanh cancels


def test_extremes_nan_and_strided_rows():
    gate = torch.tensor([0.0, -0.0, 100.0, -100.0, 1e30, -1e30, float("inf"), float("nan")] * 2)
    gate_up = torch.cat([gate, torch.full_like(gate, 2.0)]).to(torch.bfloat16)[None]
    out = gated_activation(gate_up, "gelu_tanh").float()[0]
    assert out[0] == 0 and out[1] == 0 and out[2] == 200 and out[3] == 0 and out[5] == 0  # exp overflows to inf
    assert torch.isclose(out[4], torch.tensor(2e30), rtol=1e-2) and out[6] == float("inf") and torch.isnan(out[7])
    wide = (torch.randn(6, 64) * 2).to(torch.bfloat16)
    strided = wide[:, :32]  # rows 64 apart
    assert torch.equal(gated_activation(strided, "silu"), gated_activation(strided.contiguous(), "silu"))


def test_torch_path_with_gradients_and_bad_activation():
    gate_up = torch.randn(2, 8, dtype=torch.bfloat16, requires_grad=True)
    out = gated_activation(gate_up, "gelu_tanh")
    out.float().sum().backward()  # the torch ops: gradients flow
    assert gate_up.grad is not None
    with pytest.raises(ValueError, match="activation"):
        gated_activation(gate_up.detach(), "relu")
