"""The quantized tensors of a GGUF file, by our decoder's linear layers (llama.cpp's tensor names)."""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.quantization.gguf_blocks import decode_blocks
from specdec.quantization.gguf_file import read_tensors
from specdec.quantization.quantized_weight import QuantizedWeight

# our fused linear -> llama.cpp's tensors, stacked in this order along out_features
LAYER_TENSORS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
                 "down": ("ffn_down",)}


class GGUFTensors:
    """A GGUF file's tensors, memory-mapped."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.tensors = read_tensors(self.path)

    def type_of(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def quantized(self, name: str) -> QuantizedWeight | None:
        """The tensor as a QuantizedWeight, or None when it is stored unquantized (F32, F16, BF16)."""
        if name not in self.tensors:
            raise ValueError(f"{self.path} has no tensor {name}")
        kind = self.type_of(name)
        if kind in ("F32", "F16", "BF16"):
            return None
        tensor = self.tensors[name]
        blocks = decode_blocks(tensor.data, kind)
        return QuantizedWeight(blocks, int(tensor.shape[0]), kind)

    def layer_linear(self, layer: int, ours: str) -> QuantizedWeight | None:
        """Our fused linear `ours` of layer `layer`; None when any part is unquantized (it then stays dense)."""
        parts = [self.quantized(f"blk.{layer}.{name}.weight") for name in LAYER_TENSORS[ours]]
        if any(p is None for p in parts):
            return None
        return parts[0] if len(parts) == 1 else QuantizedWeight.concat(parts)

    def lm_head(self) -> QuantizedWeight | None:
        """`output.weight`, or the tied `token_embd.weight` when the file has no separate head."""
        return self.quantized("output.weight" if "output.weight" in self.tensors else "token_embd.weight")


def check_matches(name: str, quantized: QuantizedWeight, dense: torch.Tensor, rows: int = 256) -> None:
    """Guards the name mapping: the file's dequantized tensor must be the loaded (dequantized) weight up
    to its dtype's rounding; a permuted or transposed mapping fails by far. Checks `rows` rows spread over
    the matrix (the LM head has 262144)."""
    if tuple(quantized.shape) != tuple(dense.shape):
        raise ValueError(f"{name}: GGUF shape {tuple(quantized.shape)} != loaded weight {tuple(dense.shape)}")
    pick = torch.linspace(0, dense.shape[0] - 1, min(rows, dense.shape[0])).long()
    ref = dense[pick].float()
    err = (quantized.column_blocks(pick).dequantize() - ref).abs().max()
    scale = ref.abs().max().clamp_min(1e-12)
    if float(err / scale) > 1e-2:
        raise ValueError(f"{name}: GGUF tensor differs from the loaded weight (relative {float(err / scale):.3g}); "
                         "the tensor name mapping does not fit this architecture")
