"""act(gate) * up of a gated MLP (Gemma's tanh GELU, Llama's SiLU).

bfloat16 on the CPU with the kernels: one pass (kernels/avx2_gated_act.cpp), its own fixed float32
arithmetic and one rounding, the same bits for a row whatever the batch. Elsewhere (no kernels, float32,
CUDA, training with gradients) the torch ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.models import fast_linear


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """gate_up [..., 2 I] = [gate | up] -> act(gate) * up [..., I]; activation "gelu_tanh" or "silu"."""
    if activation not in ("gelu_tanh", "silu"):
        raise ValueError(f"activation must be 'gelu_tanh' or 'silu', got {activation!r}")
    if gate_up.dtype == torch.bfloat16 and gate_up.device.type == "cpu" and not (
        gate_up.requires_grad and torch.is_grad_enabled()
    ):
        k = fast_linear.kernel()
        if k is not None and hasattr(k, "gated_act_mul"):
            return k.gated_act_mul(gate_up, activation == "gelu_tanh")
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh") if activation == "gelu_tanh" else F.silu(gate)
    return act * up
