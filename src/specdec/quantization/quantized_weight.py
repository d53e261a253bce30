"""A weight-only quantized matrix, and the linear layer that holds one in the decoder."""

from __future__ import annotations

import torch
from torch import nn

from specdec.quantization.kernel import quant_kernel, quant_kernel_isa, quant_tile_width
from specdec.quantization.reference import BLOCK, BlockWeights, reference_linear
from specdec.quantization.weight_quantizers import INT4_LEVELS


def _tiled(t: torch.Tensor, width: int) -> torch.Tensor:
    """[N, blocks, ...] -> [N / width, blocks, width, ...] contiguous (N a multiple of width)."""
    n, blocks = t.shape[:2]
    return t.reshape(n // width, width, blocks, *t.shape[2:]).transpose(1, 2).contiguous()


def _tiled_quants(q: torch.Tensor, kind: str, width: int) -> torch.Tensor:
    """[N, blocks, 32] -> the kernels' layout: per tile and block, groups of 4 k with the tile's columns side
    by side ([N / width, blocks, 8, width, 4]); u4 packs group g + 4 into the high nibbles of group g
    ([.., 4, width, 4]); s5 (s8 quants in -16..15) is u4's layout of q + 16 and a fifth-bit plane ([.., 5, ..])."""
    n, blocks, _ = q.shape
    if kind == "s5":  # u = q + 16: u4's nibbles, then a plane whose byte holds in bit g group g's fifth bit
        u = (q.to(torch.int16) + 16).to(torch.uint8)
        fifth = (_tiled_quants(u >> 4, "s8", width).to(torch.int16) << torch.arange(8).view(1, 1, 8, 1, 1)).sum(2)
        return torch.cat([_tiled_quants(u & 15, "u4", width), fifth.to(torch.uint8).unsqueeze(2)], dim=2)
    g = q.reshape(n // width, width, blocks, 8, 4).permute(0, 2, 3, 1, 4)  # [tiles, blocks, group, column, 4]
    if kind in ("s8", "s8r"):
        return g.contiguous()
    return (g[:, :, :4] | (g[:, :, 4:] << 4)).to(torch.uint8).contiguous()


def _padded_columns(blocks: BlockWeights, extra: int) -> BlockWeights:
    """`extra` all-zero columns appended (their outputs are never returned)."""
    if not extra:
        return blocks
    pad = (lambda t: None if t is None else torch.cat([t, t.new_zeros((extra, *t.shape[1:]))]))
    return BlockWeights(blocks.kind, pad(blocks.q), pad(blocks.scales), pad(blocks.mins), pad(blocks.sub_scales),
                        blocks.act_scale)


def half_exact(scales: torch.Tensor) -> bool:
    """Whether every scale is a finite float16 value (GGUF's Q8_0, Q5_0 and Q6_K store them so)."""
    s = scales.float()
    return bool(torch.isfinite(s).all()) and torch.equal(s.half().float(), s)


def halves_exact(blocks: BlockWeights) -> bool:
    """Whether the scales, and the mins where there are any, are all float16 values (then stored as such)."""
    return half_exact(blocks.scales) and (blocks.mins is None or half_exact(blocks.mins))


def fits_s5(blocks: BlockWeights) -> bool:
    """Whether s8 quants without sub-scales all lie in -16..15 (GGUF's Q5_0): the kernels read them in 5 bits."""
    return (blocks.kind == "s8" and blocks.sub_scales is None and blocks.q.numel() > 0
            and int(blocks.q.min()) >= -16 and int(blocks.q.max()) <= 15)


def per_column_scales(blocks: BlockWeights) -> bool:
    """Whether s8 blocks without sub-scales have one scale per column (int8 per output channel): the kernels
    then read it once per column instead of once a block. s8r and u4r always have (activations per row)."""
    s = blocks.scales
    rows_kind = blocks.kind in ("s8r", "u4r")
    return ((rows_kind or (blocks.kind == "s8" and blocks.sub_scales is None)) and s.dim() == 2
            and (s.shape[1] > 1 or rows_kind) and bool((s == s[:, :1]).all()))


def _u4r_integers(sub_scales: torch.Tensor, width: int) -> torch.Tensor:
    """u4r's a and c [N, blocks, 2] -> int16 [N / width, pairs, 4 * width], per tile and pair of blocks (b, b + 1;
    an odd last block paired with zeros): -c of both blocks side by side per column ([width][2], one vpdpwssd
    adds -c . (sxq_b, sxq_b+1) for 16 columns), then a of block b and of block b + 1 ([width] each)."""
    n, blocks, _ = sub_scales.shape
    t = sub_scales.to(torch.int16)
    if blocks % 2:
        t = torch.cat([t, t.new_zeros(n, 1, 2)], dim=1)
    pairs = t.shape[1] // 2
    t = t.reshape(n // width, width, pairs, 2, 2).permute(0, 2, 3, 4, 1)  # [tiles, pairs, block, (a, c), col]
    neg_c = (-t[:, :, :, 1, :]).transpose(2, 3)  # [tiles, pairs, col, block]
    return torch.cat([neg_c.reshape(n // width, pairs, 2 * width), t[:, :, :, 0, :].reshape(n // width, pairs, 2 * width)],
                     dim=2).contiguous()


def pack_tiles(blocks: BlockWeights, width: int, half_scales: bool = False, s5: bool = False,
               per_column: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(quants, scales, mins, sub_scales) in tiles of `width` columns (8: AVX2 build, 16: AVX512-VNNI), the
    columns padded with zeros to a whole tile; absent mins or sub-scales as empty tensors. `half_scales`
    stores the scales and mins as float16 (only where halves_exact: the same values, 2 bytes each a block
    fewer to read); `s5` the quants in 5 bits (only where fits_s5; the kernels' kind 2); `per_column` one
    scale per column ([N / width, 1, width]; only where per_column_scales)."""
    if half_scales and not halves_exact(blocks):
        raise ValueError("these scales (or mins) are not all float16 values")
    if s5 and not fits_s5(blocks):
        raise ValueError("s5 needs s8 quants in -16..15 without sub-scales")
    if per_column and not per_column_scales(blocks):
        raise ValueError("per-column scales need s8 blocks without sub-scales whose scale is the same in every block")
    padded = _padded_columns(blocks, -blocks.q.shape[0] % width)
    scales = padded.scales[:, :1] if per_column else padded.scales
    if padded.act_scale is not None:  # s8r's and u4r's channel multipliers ride in the mins slot, [K] float32
        mins = padded.act_scale.float().contiguous()
    elif padded.mins is not None:
        mins = _tiled(padded.mins.half() if half_scales else padded.mins.float(), width)
    else:
        mins = torch.empty(0)
    return (
        _tiled_quants(padded.q, "s5" if s5 else padded.kind, width),
        _tiled(scales.half() if half_scales else scales.float(), width),
        mins,
        _u4r_integers(padded.sub_scales, width) if padded.kind == "u4r"
        else _tiled(padded.sub_scales.to(torch.int16), width) if padded.sub_scales is not None
        else torch.empty(0, dtype=torch.int16),
    )


class QuantizedWeight:
    """An [out_features, in_features] weight stored as blocks of 32 quantized values with float scales.

    `format` names where it came from ("int8", "int4", "Q8_0", "Q4_K", ...) for reports. On CPUs with AVX2
    the product runs in our kernel (its tiles packed for the build that runs here, see kernel.py); elsewhere
    in reference_linear, which gives the same bits.
    """

    def __init__(self, blocks: BlockWeights, in_features: int, format: str) -> None:
        n = blocks.q.shape[0]
        if blocks.q.shape[1] * BLOCK != in_features:
            raise ValueError(f"in_features {in_features} is not {blocks.q.shape[1]} blocks of {BLOCK}")
        if blocks.kind == "u4r":  # the AMX kernel multiplies a * q as one unsigned byte
            if blocks.sub_scales is None:
                raise ValueError("int4 (u4r) needs sub_scales: each group's multiplier a and offset c")
            a = blocks.sub_scales[..., 0]
            if a.numel() and not (int(a.min()) >= 0 and int(a.max()) <= INT4_LEVELS):
                raise ValueError(f"int4 (u4r): each group's multiplier a must be in 0..{INT4_LEVELS}, got "
                                 f"{int(a.min())}..{int(a.max())}")
        self.blocks, self.in_features, self.out_features, self.format = blocks, in_features, n, format
        self.kind = blocks.kind
        self._width = quant_tile_width()  # the layout of the build that runs here
        # the kernels read float16 scales and mins (a GGUF's own, and our int8 ones: the Q8_0 LM head's
        # pass 5% shorter) and Q5_0's quants in 5 bits (22 bytes a block instead of 34: the MLP's
        # gate_up), with the same bits
        # int8 per output channel stores its scale once per column (6% of its bytes fewer)
        kernel = quant_kernel_isa() is not None
        s5 = kernel and fits_s5(blocks)
        self._kind_id = {"s8": 0, "u4": 1, "s8r": 3, "u4r": 4}[self.kind] if not s5 else 2  # the kernels' `kind`
        self._tiles = pack_tiles(blocks, self._width, kernel and halves_exact(blocks), s5,
                                 kernel and not s5 and per_column_scales(blocks))

    def _kernel(self, device: torch.device) -> object | None:
        """The compiled module for this weight and inputs on `device`, or None (then reference_linear): the
        CPU, and a build that has this kind (a module without quant_linear_row_kinds leaves s8r and u4r, the
        kinds with activations per row, to the reference)."""
        if device.type != "cpu":
            return None
        module = quant_kernel()
        if module is not None and self._kind_id >= 3 and self._kind_id not in getattr(module, "quant_linear_row_kinds", ()):
            return None
        return module

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def nbytes(self) -> int:
        """Bytes one pass over the weight reads (quants, scales, mins, sub-scales)."""
        return sum(t.numel() * t.element_size() for t in self._tiles)

    def dequantize(self) -> torch.Tensor:
        return self.blocks.dequantize()

    def linear_float(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, in_features] @ W.T as float32 [M, out_features]; each row's bits independent of M."""
        return self.linear_columns(x, slice(None))

    def linear_rows(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """linear_float(x).to(dtype), with the same bits. The decoder's path: on the CPU one kernel call that
        rounds to bfloat16 as it stores (a decode step makes ~70 of these calls, and each torch op or Python
        layer around them cost more than a tenth of a one-row step's time)."""
        kernel = self._kernel(x.device) if dtype in (torch.bfloat16, torch.float32) else None
        if kernel is None:
            return self.linear_float(x).to(dtype)
        y = kernel.quant_linear(x, *self._tiles, self._kind_id, dtype == torch.bfloat16)
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]

    def greedy_rows(self, x: torch.Tensor) -> torch.Tensor | None:
        """greedy_argmax(self.linear_float(x)) [M] int64 without the float32 values, where the kernel has it
        (one pass that keeps each row's best column: the LM head's logits are 1 MB a row); else None."""
        kernel = self._kernel(x.device) if x.dim() == 2 else None
        if kernel is None or not hasattr(kernel, "quant_linear_argmax") or self.out_features == 0:
            return None
        return kernel.quant_linear_argmax(x, *self._tiles, self._kind_id, self.out_features)

    def max_columns(self, x: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(values [M] float32, indices [M] int64 within `columns`): each row's greedy_argmax over
        linear_columns(x, columns) and the value there, without the float32 values of the other columns, in
        one kernel pass over the tiles covering them; None where the kernel lacks it or `columns` starts
        inside a tile (then score the columns)."""
        kernel = self._kernel(x.device) if x.dim() == 2 else None
        if kernel is None or not hasattr(kernel, "quant_linear_max") or columns.step not in (None, 1):
            return None
        start, stop, _ = columns.indices(self.out_features)
        if stop <= start or start % self._width:
            return None
        indices, values = kernel.quant_linear_max(x, *self._tiles_covering(start, stop), self._kind_id, stop - start)
        return values, indices

    def _tiles_covering(self, start: int, stop: int) -> list[torch.Tensor]:
        """The packed tiles whose columns cover [start, stop) (the first starts at or before `start`); s8r's
        and u4r's channel multipliers (in the mins slot) are per input channel, so whole."""
        t0, t1 = start // self._width, -(-stop // self._width)
        return [t[t0:t1] if t.numel() and not (i == 2 and self.kind in ("s8r", "u4r")) else t
                for i, t in enumerate(self._tiles)]

    def kernel_args(self) -> tuple[tuple[torch.Tensor, ...], int, int]:
        """The tiles and kind id that the kernel's quant_linear takes for this weight, as linear_rows passes
        them, and that function's address (0 without a build here) for a C++ caller such as
        decoder.DecoderLayer's one-call layer."""
        module = self._kernel(torch.device("cpu"))
        address = int(module.quant_linear_address()) if hasattr(module, "quant_linear_address") else 0
        return self._tiles, self._kind_id, address

    def column_blocks(self, columns: slice | torch.Tensor) -> BlockWeights:
        b = self.blocks
        pick = (lambda t: None if t is None else t[columns])
        return BlockWeights(b.kind, b.q[columns], b.scales[columns], pick(b.mins), pick(b.sub_scales), b.act_scale)

    def linear_columns(self, x: torch.Tensor, columns: slice | torch.Tensor) -> torch.Tensor:
        """linear_float(x)[:, columns], computing (about) only those columns, with the same bits: a range
        runs in the kernel over the tiles covering it, token ids (a few) in the reference."""
        kernel = self._kernel(x.device)
        if kernel is None or not isinstance(columns, slice) or columns.step not in (None, 1):
            return reference_linear(x.cpu(), self.column_blocks(columns)).to(x.device)
        start, stop, _ = columns.indices(self.out_features)
        if stop <= start:
            return x.new_zeros((x.shape[0], 0), dtype=torch.float32)
        width = self._width
        t0, t1 = start // width, -(-stop // width)
        y = kernel.quant_linear(x, *self._tiles_covering(start, stop), self._kind_id)
        return y if (start, stop) == (t0 * width, t1 * width) else y[:, start - t0 * width : stop - t0 * width]

    @staticmethod
    def concat(parts: list[QuantizedWeight]) -> QuantizedWeight:
        """The parts stacked along out_features (q, k and v fused), all of one kind."""
        kinds = {p.kind for p in parts}
        if len(kinds) != 1 or len({p.in_features for p in parts}) != 1:
            raise ValueError("only weights of one kind and in_features can be fused")
        if any(p.blocks.sub_scales is not None for p in parts):  # a part without sub-scales: all ones
            subs = [p.blocks.sub_scales if p.blocks.sub_scales is not None
                    else torch.ones(*p.blocks.scales.shape, 2, dtype=torch.int16) for p in parts]
        else:
            subs = None

        def cat(values: list[torch.Tensor | None]) -> torch.Tensor | None:
            return None if values is None or values[0] is None else torch.cat(values)

        b = [p.blocks for p in parts]
        act = b[0].act_scale  # the parts share their input, so its channel scales
        if any((x.act_scale is None) != (act is None) or (act is not None and not torch.equal(x.act_scale, act))
               for x in b):
            raise ValueError("only weights with the same activation scales can be fused")
        blocks = BlockWeights(parts[0].kind, cat([x.q for x in b]), cat([x.scales for x in b]),
                              cat([x.mins for x in b]), cat(subs), act)
        return QuantizedWeight(blocks, parts[0].in_features, "+".join(dict.fromkeys(p.format for p in parts)))


class QuantizedLinear(nn.Module):
    """Stands in for nn.Linear in the decoder: fast_linear.linear sees `weight` is quantized."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def in_features(self) -> int:
        return self.weight.in_features

    @property
    def out_features(self) -> int:
        return self.weight.out_features

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, format={self.weight.format}"
