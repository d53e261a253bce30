"""kernels/avx2_exp.h's exp as float32 torch ops, one IEEE operation at a time: the reference the kernels that
use it (the gated activation, the softmax) are checked against bit for bit."""

from __future__ import annotations

import torch

_P = [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1]


def f32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


def documented_exp(z: torch.Tensor) -> torch.Tensor:
    under = z < -87.0
    z = z.clamp(-87.0, 89.0)
    k = torch.round(z * f32(1.44269504088896341))
    r = (z - k * f32(0.693359375)) - k * f32(-2.12194440e-4)
    p = f32(_P[0])
    for c in _P[1:]:
        p = p * r + f32(c)
    p = (p * (r * r) + r) + f32(1.0)
    return torch.where(under, 0.0, p * torch.ldexp(torch.ones_like(k), k.to(torch.int32)))
