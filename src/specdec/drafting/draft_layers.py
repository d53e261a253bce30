"""Building blocks shared by the learned drafters' networks (EAGLE-3, DFlash)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models import fast_linear
from specdec.models.decoder import rms_norm
from specdec.models.fast_linear import linear, module_linear
from specdec.models.gated_activation import gated_activation

if TYPE_CHECKING:
    from specdec.drafting.int8_weights import Int8Copies


_ROPE_TABLES: dict[tuple[float, int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _rope_table(theta: float, half: int, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin [>= length, half], computed once per (theta, size, device) and grown by doubling: a
    draft step rotates a handful of positions, where computing the angles each call costs more than the rest."""
    key = (theta, half, device)
    table = _ROPE_TABLES.get(key)
    if table is None or table[0].shape[0] < length:
        size = max(1024, 1 << max(length - 1, 1).bit_length())
        inv = 1.0 / (theta ** (torch.arange(half, device=device, dtype=torch.float32) / half))
        ang = torch.arange(size, device=device, dtype=torch.float32)[:, None] * inv[None]
        table = _ROPE_TABLES[key] = (ang.cos(), ang.sin())
    return table


_ROPE_ROWS: dict[tuple[float, int, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def rope_rows_tables(theta: float, head_dim: int, length: int, device: torch.device,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope`'s angles as the kernel's rope_rows takes them: cos [>= length, head_dim] and sin with its first
    half negated, in `dtype` (each value the rounding `rope` applies to it, so the same bits)."""
    half = head_dim // 2
    cos_t, sin_t = _rope_table(theta, half, length, device)
    key = (theta, half, device, dtype)
    rows = _ROPE_ROWS.get(key)
    if rows is None or rows[0].shape[0] != cos_t.shape[0]:
        cos, sin = cos_t.to(dtype), sin_t.to(dtype)
        rows = _ROPE_ROWS[key] = (torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1))
    return rows


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama-style RoPE (halves rotated) on x [..., *positions.shape, head_dim], integer positions of any shape."""
    half = x.shape[-1] // 2
    cos_t, sin_t = _rope_table(theta, half, int(positions.max()) + 1 if positions.numel() else 1, x.device)
    cos, sin = cos_t[positions].to(x.dtype), sin_t[positions].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 whatever the input dtype (float32 in training, bf16 at inference)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self._scale: tuple[tuple[int, int, torch.dtype], torch.Tensor] | None = None

    def scale(self) -> torch.Tensor:
        """The weight in float32, converted once per change of the weight (a copy per call otherwise)."""
        key = (self.weight.data_ptr(), self.weight._version, self.weight.dtype)
        if self._scale is None or self._scale[0] != key:
            self._scale = (key, self.weight.detach().float())
        return self._scale[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dim() != 2:
            return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)
        # inference: the target's norm (one kernel call in bfloat16 on CPU: at 32 sequences the float32
        # round trip of a drafter step's four norms took a seventh of its time), the same arithmetic
        return rms_norm(x, self.scale(), self.eps, gemma=True)


class StackedWeight:
    """Several linears' weights stacked along the output dim for inference (one kernel call instead of one
    per linear; each row's bits are the separate products'), rebuilt when any of them changed (training
    steps, loading), and packed for the AMX kernels where they are."""

    def __init__(self) -> None:
        self._cached: tuple[tuple[int, ...], torch.Tensor] | None = None

    def of(self, *weights: torch.Tensor) -> torch.Tensor:
        key = tuple(x for w in weights for x in (w.data_ptr(), w._version))
        if self._cached is None or self._cached[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # a normal tensor: packing tracks its version
                self._cached = (key, torch.cat([w.detach() for w in weights]).contiguous())
                fast_linear.pack_weight(self._cached[1])  # where the AMX kernels are: their layout, same bits
        return self._cached[1]


class GatedMLP(nn.Module):
    """Llama's SiLU-gated MLP (parameter names as in transformers and speculators)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

        self._gate_up = StackedWeight()
        self.int8: Int8Copies | None = None  # a drafter's use_int8_weights: inference on int8 copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin = module_linear
        if torch.is_grad_enabled() or x.dim() != 2:
            return lin(self.down_proj, F.silu(lin(self.gate_proj, x)) * lin(self.up_proj, x))
        # inference: gate and up in one linear and the activation in one pass (gated_activation.py), as the
        # target's MLP runs; one rounding of silu(gate) * up instead of two
        gate_up_weight = self._gate_up.of(self.gate_proj.weight, self.up_proj.weight)
        if self.int8 is not None:
            gate_up = linear(x.to(self.gate_proj.weight.dtype), self.int8.of("gate_up", gate_up_weight))
            return linear(gated_activation(gate_up, "silu"), self.int8.of("down", self.down_proj.weight))
        gate_up = linear(x.to(self.gate_proj.weight.dtype), gate_up_weight)
        return lin(self.down_proj, gated_activation(gate_up, "silu"))
