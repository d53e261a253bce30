"""Quantized targets: int8, int4 and w8a8_int8 (int8 activations per row, SmoothQuant) and a GGUF file's own
quantized tensors, run by a row-invariant CPU kernel so that speculative output still equals plain output of
the same quantized model."""

from specdec.quantization.apply import MODES, check_mode, quantize_decoder
from specdec.quantization.quantized_weight import QuantizedLinear, QuantizedWeight

__all__ = ["MODES", "QuantizedLinear", "QuantizedWeight", "check_mode", "quantize_decoder"]
