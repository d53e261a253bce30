"""Building blocks shared by the learned drafters' networks (EAGLE-3, DFlash)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.fast_linear import module_linear


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 whatever the input dtype (bf16 autocast in training, bf16 inference)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class GatedMLP(nn.Module):
    """Llama's SiLU-gated MLP (parameter names as in transformers and speculators)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin = module_linear
        return lin(self.down_proj, F.silu(lin(self.gate_proj, x)) * lin(self.up_proj, x))
