"""The quantized linear's arithmetic in torch, op for op as the kernels compute it (kernels/
avx2_quant_linear.cpp, and avx512_vnni_quant_linear.cpp, whose integer sums differ only in order).

It is the portable fallback (CPUs without AVX2, CUDA, SPECDEC_NO_KERNELS=1) and the tests' reference for
the kernels: all give the same bits. Integer dot products are exact in any order; the float part is one
fixed chain per output element, block after block, with no fused multiply-add:
    s8: y = y + float(isum) * (s * dx)
    u4: y = y + (float(isum) * (s * dx) - m * (dx * float(bsum)))
except kind "s8r" (W8A8: `w8a8_int8`), whose activations are quantized once per row and whose weights have
one scale per column: its integer sum runs over the whole row, then one product per output element,
    s8r: y = float(isum) * (s * dx)
so that the AMX tiles accumulate a row's products in int32 without a float chain per block; and kind "u4r"
(`int4`), whose 4-bit quants have an integer multiplier a and offset c per block on top of one float scale
per column, so that a row's sum is exact in int32 as well (activations per row, sxq the block's sum of qx):
    u4r: y = float(sum over blocks of a * isum - c * sxq) * (s * dx)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
# columns per einsum in the fallback: bounds its float64 temporaries (the LM head has 262144 columns)
_COLUMNS_PER_CHUNK = 8192


@dataclass
class QuantizedActivations:
    """x [M, K] quantized per block of 32: q in -127..127 (float, exact), dx and dx * sum(q) per block."""

    q: torch.Tensor  # [M, blocks, 32] float32 holding integers
    dx: torch.Tensor  # [M, blocks]
    sx: torch.Tensor  # [M, blocks]


def quantize_activations(x: torch.Tensor, per_row: bool = False) -> QuantizedActivations:
    """Per block of 32, or with `per_row` one scale for the whole row (dx and sx then [M, 1])."""
    m, k = x.shape
    if k % BLOCK:
        raise ValueError(f"K must be a multiple of {BLOCK}, got {k}")
    xb = x.float().reshape(m, 1 if per_row else k // BLOCK, k if per_row else BLOCK)
    amax = xb.abs().amax(-1)
    dx = amax / 127.0
    inv = torch.where(dx > 0, 1.0 / dx, torch.zeros_like(dx))
    q = torch.round(xb * inv[..., None])  # round half to even, as the kernel's nearbyint
    q = q.reshape(m, k // BLOCK, BLOCK)
    return QuantizedActivations(q, dx, dx * q.sum((-2, -1))[:, None] if per_row else dx * q.sum(-1))


@dataclass
class BlockWeights:
    """Weights per column and block of 32, untiled: the layout the reference computes on.

    kind "s8": w = s * q (times the sub-scale of q's half of the block, when there are sub-scales);
    kind "u4": w = s * q - m, q in 0..15;
    kind "s8r": w = s * q with one s per column (repeated per block here), activations per row, each
    channel first multiplied by `act_scale` where there is one (SmoothQuant: the weights were fitted to x
    times it, see smoothing.py);
    kind "u4r": w = s * (a * q - c), q in 0..15, s per column (repeated per block), the integers a (>= 0) and c
    per block in sub_scales[..., 0] and [..., 1]; activations per row and act_scale as s8r.
    """

    kind: str
    q: torch.Tensor  # [N, blocks, 32] int8 (s8) or uint8 (u4)
    scales: torch.Tensor  # [N, blocks] float32
    mins: torch.Tensor | None = None  # [N, blocks] float32 (u4)
    sub_scales: torch.Tensor | None = None  # [N, blocks, 2] int16 (s8: Q6_K's per-16 scales; u4r: a and c)
    act_scale: torch.Tensor | None = None  # [K] float32 (s8r): x * act_scale is what gets quantized

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K]: the weights the arithmetic multiplies by (up to its float rounding)."""
        q = self.q.float()
        if self.kind == "u4r":
            q = q * self.sub_scales[..., :1].float() - self.sub_scales[..., 1:].float()
        elif self.sub_scales is not None:
            q = q * self.sub_scales.float().repeat_interleave(BLOCK // 2, dim=-1)
        w = q * self.scales[..., None]
        if self.kind == "u4":
            w = w - self.mins[..., None]
        w = w.reshape(self.q.shape[0], -1)
        # SmoothQuant's x * act_scale against these weights: x against their product with act_scale
        return w if self.act_scale is None else w * self.act_scale


def _integer_dots(a: QuantizedActivations, w: BlockWeights) -> torch.Tensor:
    """isum [M, N, blocks] as float64 (exact: every term and sum is an integer below 2^53)."""
    q = w.q.double()
    if w.kind == "u4r":  # sum over blocks of a * (q . qx) - c * sum(qx)
        isum = torch.einsum("mbk,nbk->mnb", a.q.double(), q)
        sub = w.sub_scales.double()
        return isum * sub[None, :, :, 0] - a.q.double().sum(-1)[:, None, :] * sub[None, :, :, 1]
    if w.sub_scales is None:
        return torch.einsum("mbk,nbk->mnb", a.q.double(), q)
    half = BLOCK // 2
    sub = w.sub_scales.double()
    lo = torch.einsum("mbk,nbk->mnb", a.q[..., :half].double(), q[..., :half])
    hi = torch.einsum("mbk,nbk->mnb", a.q[..., half:].double(), q[..., half:])
    return lo * sub[None, :, :, 0] + hi * sub[None, :, :, 1]


def reference_linear(x: torch.Tensor, w: BlockWeights) -> torch.Tensor:
    """x [M, K] @ dequant(w).T as float32 [M, N], bit-identical to the kernel."""
    if w.act_scale is not None:  # one float32 product per element, as the kernel's
        x = x.float() * w.act_scale
    a = quantize_activations(x, per_row=w.kind in ("s8r", "u4r"))
    n = w.q.shape[0]
    out = []
    for lo in range(0, n, _COLUMNS_PER_CHUNK):
        part = BlockWeights(w.kind, w.q[lo : lo + _COLUMNS_PER_CHUNK], w.scales[lo : lo + _COLUMNS_PER_CHUNK],
                            None if w.mins is None else w.mins[lo : lo + _COLUMNS_PER_CHUNK],
                            None if w.sub_scales is None else w.sub_scales[lo : lo + _COLUMNS_PER_CHUNK],
                            w.act_scale)
        if w.kind in ("s8r", "u4r"):  # one exact sum over the row (float64 holds it), one rounding to float32
            t = part.scales[None, :, 0] * a.dx
            out.append(_integer_dots(a, part).sum(-1).float() * t)
            continue
        isum = _integer_dots(a, part).float()
        y = torch.zeros(x.shape[0], part.q.shape[0], dtype=torch.float32)
        for b in range(isum.shape[-1]):
            t = part.scales[None, :, b] * a.dx[:, b, None]
            if w.kind == "s8":
                y = y + isum[:, :, b] * t
            else:
                y = y + (isum[:, :, b] * t - part.mins[None, :, b] * a.sx[:, b, None])
        out.append(y)
    return torch.cat(out, dim=1) if out else torch.zeros(x.shape[0], 0)
