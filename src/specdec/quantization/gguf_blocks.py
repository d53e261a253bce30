"""GGUF's quantized block formats decoded into BlockWeights, without dequantizing: the kernel then runs
the very weights llama.cpp runs. Layouts follow ggml (ggml-quants.c); the `gguf` package's dequantize is
the tests' reference. Supported: Q8_0, Q5_0, Q4_K and Q6_K (the default model's Q4_K_M mix)."""

from __future__ import annotations

import numpy as np
import torch

from specdec.quantization.reference import BlockWeights

SUPPORTED = ("Q8_0", "Q5_0", "Q4_K", "Q6_K")


def _half(raw: np.ndarray) -> np.ndarray:
    """Little-endian fp16 from [..., 2] uint8, as float32."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _q8_0(data: np.ndarray) -> BlockWeights:  # blocks of 32: fp16 d, 32 x int8; w = d * q
    d = _half(data[..., 0:2])
    q = np.ascontiguousarray(data[..., 2:34]).view(np.int8)
    if (q == -128).any():  # the sign trick of the s8 kernel cannot negate -128 (llama.cpp never writes it)
        raise ValueError("Q8_0 tensor holds the quant -128, which this kernel does not support")
    return BlockWeights("s8", torch.from_numpy(q.copy()), torch.from_numpy(d))


def _q5_0(data: np.ndarray) -> BlockWeights:  # fp16 d, 32 high bits, 16 bytes of nibbles; w = d * (q - 16)
    d = _half(data[..., 0:2])
    qh = np.ascontiguousarray(data[..., 2:6]).view("<u4")[..., 0]
    qs = data[..., 6:22].astype(np.int16)
    j = np.arange(16)
    lo = (qs & 0x0F) | (((qh[..., None] >> j) & 1) << 4).astype(np.int16)
    hi = (qs >> 4) | (((qh[..., None] >> (j + 16)) & 1) << 4).astype(np.int16)
    q = (np.concatenate([lo, hi], axis=-1) - 16).astype(np.int8)
    return BlockWeights("s8", torch.from_numpy(q), torch.from_numpy(d))


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    s = scales.astype(np.int32)
    sc = np.empty(s.shape[:-1] + (8,), np.int32)
    mn = np.empty_like(sc)
    sc[..., :4], mn[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _q4_k(data: np.ndarray) -> BlockWeights:
    """Super-blocks of 256: fp16 d and dmin, 12 bytes of scales and mins, 128 bytes of nibbles (per 64
    weights, 32 bytes: low nibbles the first 32, high ones the next). w = (d * sc) * q - dmin * m."""
    d, dmin = _half(data[..., 0:2]), _half(data[..., 2:4])
    sc, mn = _k_scale_min(data[..., 4:16])
    qs = data[..., 16:144].reshape(*data.shape[:-1], 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(*data.shape[:-1], 8, 32)  # 8 sub-blocks of 32
    scales = d[..., None] * sc.astype(np.float32)
    mins = dmin[..., None] * mn.astype(np.float32)
    rows = data.shape[0]
    return BlockWeights("u4", torch.from_numpy(q.reshape(rows, -1, 32).astype(np.uint8)),
                        torch.from_numpy(scales.reshape(rows, -1)), torch.from_numpy(mins.reshape(rows, -1)))


def _q6_k(data: np.ndarray) -> BlockWeights:
    """Super-blocks of 256: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales (per 16), fp16 d.
    w = d * sc * (q - 32): int8 q - 32 with the scales as per-16 sub-scales and d per block of 32."""
    ql, qh = data[..., 0:128].astype(np.int16), data[..., 128:192].astype(np.int16)
    sc = np.ascontiguousarray(data[..., 192:208]).view(np.int8)
    d = _half(data[..., 208:210])
    out = []
    for n in range(2):  # two halves of 128, as ggml's dequantize_row_q6_K
        l_lo, l_hi, h = ql[..., 64 * n : 64 * n + 32], ql[..., 64 * n + 32 : 64 * n + 64], qh[..., 32 * n : 32 * n + 32]
        out += [(l_lo & 0x0F) | ((h & 3) << 4), (l_hi & 0x0F) | (((h >> 2) & 3) << 4),
                (l_lo >> 4) | (((h >> 4) & 3) << 4), (l_hi >> 4) | (((h >> 6) & 3) << 4)]
    q = (np.stack(out, axis=-2) - 32).astype(np.int8)  # [..., 8 blocks of 32]
    rows = data.shape[0]
    sub = sc.reshape(*sc.shape[:-1], 8, 2).astype(np.int16)
    scales = np.repeat(d[..., None], 8, axis=-1)
    return BlockWeights("s8", torch.from_numpy(q.reshape(rows, -1, 32)), torch.from_numpy(scales.reshape(rows, -1)),
                        sub_scales=torch.from_numpy(sub.reshape(rows, -1, 2)))


_DECODERS = {"Q8_0": (_q8_0, 34, 32), "Q5_0": (_q5_0, 22, 32), "Q4_K": (_q4_k, 144, 256), "Q6_K": (_q6_k, 210, 256)}


def decode_blocks(data: np.ndarray, type_name: str) -> BlockWeights:
    """data: a GGUF tensor's raw bytes as [rows, bytes per row] uint8 (GGUFReader's `data`)."""
    if type_name not in _DECODERS:
        raise ValueError(f"GGUF type {type_name} is not supported for quantized loading; supported: {', '.join(SUPPORTED)}")
    decode, size, per_block = _DECODERS[type_name]
    rows, nbytes = data.shape
    if nbytes % size:
        raise ValueError(f"{type_name}: a row of {nbytes} bytes is not whole blocks of {size}")
    return decode(np.asarray(data, dtype=np.uint8).reshape(rows, nbytes // size, size))
