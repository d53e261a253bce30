"""Quantizing float weights: int8 per output channel (scales that are float16 values, as GGUF's Q8_0 stores
them: the kernels read 2 bytes each), W8A8, and int4 per group of 32 (asymmetric, least-squares refined, then
each group's scale and offset made integer multiples of one scale per column, for activations per row).
All give BlockWeights the kernels run."""

from __future__ import annotations

import torch

from specdec.quantization.reference import BLOCK, BlockWeights


def _blocks_of(weight: torch.Tensor) -> torch.Tensor:
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"in_features must be a multiple of {BLOCK} to quantize, got {k}")
    return weight.detach().float().reshape(n, k // BLOCK, BLOCK)


def _half_values(t: torch.Tensor) -> torch.Tensor:
    """t rounded to float16 values (kept as float32), where they stay finite."""
    h = t.half().float()
    return torch.where(torch.isfinite(h), h, t)


def quantize_int8(weight: torch.Tensor) -> BlockWeights:
    """Symmetric int8 with one scale per output channel (vLLM's W8A16 / torchao's int8 weight-only), q in
    -127..127; the channel's scale is repeated per block (the reference's layout; the kernels store it once
    per column, quantized_weight.per_column_scales)."""
    w = _blocks_of(weight)
    scale = _half_values(w.abs().amax(dim=(1, 2)) / 127.0)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / safe[:, None, None]).clamp_(-127, 127).to(torch.int8)
    return BlockWeights("s8", q, scale[:, None].expand(-1, w.shape[1]).contiguous())


# the kernels' int32 sums over a whole row: |sum of (q + 128) * qx| <= 383 * 127 * K stays below 2^31
MAX_W8A8_IN_FEATURES = 32768


def quantize_w8a8(weight: torch.Tensor, channel_scales: torch.Tensor | None = None) -> BlockWeights:
    """int8 weights per output channel for W8A8 (SGLang's `w8a8_int8`, vLLM's int8 W8A8 with dynamic
    per-token activations): activations quantized once per row, so each output is one integer sum over the
    row and one float product (reference.py, kind "s8r"). With SmoothQuant's `channel_scales` t
    (smoothing.channel_scales), the weight's columns are multiplied by t before quantizing and x by 1 / t
    before its row is quantized (act_scale)."""
    if weight.shape[1] > MAX_W8A8_IN_FEATURES:
        raise ValueError(f"w8a8_int8 sums a row in int32: in_features at most {MAX_W8A8_IN_FEATURES}, "
                         f"got {weight.shape[1]}")
    if channel_scales is None:
        b = quantize_int8(weight)
        return BlockWeights("s8r", b.q, b.scales)
    t = channel_scales.float()
    if t.shape != (weight.shape[1],) or not bool(torch.isfinite(t).all() and (t > 0).all()):
        raise ValueError("channel_scales: one finite positive value per input channel")
    b = quantize_int8(weight.detach().float() * t)
    return BlockWeights("s8r", b.q, b.scales, act_scale=(1.0 / t).contiguous())


_ROWS_PER_CHUNK = 4096  # rows quantized at a time: the temporaries stay in cache (the LM head has 262144)
INT4_LEVELS = 16  # the largest multiplier a of a group's scale: a * q <= 240 is one byte for the AMX kernel


# the widest row the int32 bound allows even with a = 1
MAX_INT4_IN_FEATURES = (2**31 - 1) // (31 * 127)


def int4_levels(in_features: int) -> int:
    """The largest multiplier a for int4 on in_features: the kernels' int32 sums over a row of
    sum((a q - c) qx), with q <= 15, |c| <= 16 a_max and |qx| <= 127, stay below 2^31."""
    return max(1, min(INT4_LEVELS, (2**31 - 1) // (31 * 127 * in_features)))


def quantize_int4(weight: torch.Tensor, refinements: int = 2, channel_scales: torch.Tensor | None = None) -> BlockWeights:
    """4-bit weights per group of 32 for activations quantized per row (kind "u4r"): w = s * (a * q - c), q in
    0..15, one float scale s per column and integers a (1..int4_levels) and c per group. Each group is first
    fitted as Q4_1 / AWQ's zero points fit it (quantize_q4_1: w ~ s_g q - m_g, least-squares refined),
    then s_g and m_g are rounded to multiples of the column's s (a = s_g / s, c = m_g / s) and q rounded again
    against them. The integers let a row's sum run in int32 across blocks without a float chain per block
    (reference.py), and a up to 16 makes a * q one byte, one AMX product per 16 rows (avx512_u4r_rows.h). On
    the default model and 4 held-out articles: perplexity 17.38 and top-1 agreement with bf16 0.769, against
    16.98 and 0.777 with a up to 255 (bf16: 14.44). With SmoothQuant's `channel_scales` t, as quantize_w8a8."""
    n, k = weight.shape
    if k > MAX_INT4_IN_FEATURES:
        raise ValueError(f"int4 sums a row in int32: in_features at most {MAX_INT4_IN_FEATURES}, got {k}")
    w = weight.detach().float()
    act = None
    if channel_scales is not None:
        t = channel_scales.float()
        if t.shape != (k,) or not bool(torch.isfinite(t).all() and (t > 0).all()):
            raise ValueError("channel_scales: one finite positive value per input channel")
        w, act = w * t, (1.0 / t).contiguous()
    levels = int4_levels(k)
    parts = [_integer_groups(w[i : i + _ROWS_PER_CHUNK], refinements, levels) for i in range(0, n, _ROWS_PER_CHUNK)]
    return BlockWeights("u4r", torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                        sub_scales=torch.cat([p[2] for p in parts]), act_scale=act)


def _integer_groups(w: torch.Tensor, refinements: int, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8 [n, blocks, 32], s [n, blocks] float32 (the column's, repeated), a and c int16 [n, blocks, 2])."""
    fit = quantize_q4_1(w, refinements)
    g = _blocks_of(w)
    # the column's scale: the largest group scale is `levels` of it, and |c| <= 16 levels (the int32 bound)
    s = torch.maximum(fit.scales.amax(-1) / levels, fit.mins.abs().amax(-1) / (16 * levels))
    s = torch.where(s > 0, s, torch.ones_like(s))  # an all-zero column: q, a and c give zeros
    x = g / s[:, None, None]
    ideal = fit.scales / s[:, None]
    best = None
    # a rounded down clips the group's ends, rounded up coarsens its grid: each group keeps the one that fits
    # it better (with a <= 16, rounding to nearest alone clipped up to a third of a small group's range)
    c0 = torch.round(fit.mins / s[:, None]).clamp_(-16 * levels, 16 * levels)
    for a in (ideal.floor().clamp(1, levels), ideal.ceil().clamp(1, levels)):
        q = torch.round((x + c0[..., None]) / a[..., None]).clamp_(0, 15)
        # the offset that best fits the rounded q (least squares over the group, rounded), then q again
        c = torch.round((a[..., None] * q - x).mean(-1)).clamp_(-16 * levels, 16 * levels)
        q = torch.round((x + c[..., None]) / a[..., None]).clamp_(0, 15)
        err = (a[..., None] * q - c[..., None] - x).square().sum(-1)
        if best is None:
            best = (err, a, c, q)
        else:
            better = err < best[0]
            best = (torch.where(better, err, best[0]), torch.where(better, a, best[1]),
                    torch.where(better, c, best[2]), torch.where(better[..., None], q, best[3]))
    _, a, c, q = best
    return (q.to(torch.uint8), s[:, None].expand(-1, g.shape[1]).contiguous(),
            torch.stack([a, c], dim=-1).to(torch.int16))


def quantize_q4_1(weight: torch.Tensor, refinements: int = 2) -> BlockWeights:
    """Asymmetric 4-bit per group of 32 (w = s * q - m, q in 0..15), like ggml's Q4_1 / AWQ's zero points.

    Starts from the group's min and max, then alternates rounding with the least-squares s and m for the
    rounded q (each step cannot increase the squared error for fixed q), keeping the best found. Each
    candidate is judged as stored: s and m rounded to float16 values, q rounded against them."""
    w = _blocks_of(weight)
    lo, hi = w.amin(-1), w.amax(-1)
    s = (hi - lo) / 15.0
    m = -lo
    best = None
    for _ in range(refinements + 1):
        s, m = _half_values(s), _half_values(m)  # the values stored: candidates are judged as stored
        safe = torch.where(s > 0, s, torch.ones_like(s))
        q = torch.round((w + m[..., None]) / safe[..., None]).clamp_(0, 15)
        err = ((q * s[..., None] - m[..., None]) - w).square().sum(-1)
        if best is None:
            best = (err, q, s, m)
        else:
            better = err < best[0]
            best = tuple(torch.where(better[..., None] if t.dim() == 3 else better, t, b)
                         for t, b in zip((err, q, s, m), best))
        # least squares for w ~ s * q - m given q
        n = q.shape[-1]
        sq, sw, sqq, sqw = q.sum(-1), w.sum(-1), (q * q).sum(-1), (q * w).sum(-1)
        det = n * sqq - sq * sq
        ok = det > 0
        s = torch.where(ok, (n * sqw - sq * sw) / torch.where(ok, det, torch.ones_like(det)), s)
        m = torch.where(ok, (s * sq - sw) / n, m)
        s = s.clamp_min(0)
    _, q, s, m = best
    return BlockWeights("u4", q.to(torch.uint8), s.contiguous(), m.contiguous())
