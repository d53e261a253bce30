"""Swaps a decoder's linear layers (and LM head) for quantized ones: `quantization=` of LLM/load_model."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from tqdm import tqdm

from specdec.models.decoder import Decoder
from specdec.quantization.gguf_weights import LAYER_TENSORS, GGUFTensors, check_matches
from specdec.quantization.quantized_weight import QuantizedLinear, QuantizedWeight
from specdec.quantization.smoothing import channel_scales, input_maxima
from specdec.quantization.weight_quantizers import quantize_int4, quantize_int8, quantize_w8a8

logger = logging.getLogger(__name__)

# vLLM's `quantization` key and values where they exist ("gguf": the file's own quantized tensors;
# "w8a8_int8": SGLang's name for int8 weights with int8 activations quantized per token)
MODES = ("int8", "int4", "w8a8_int8", "gguf")
# the modes whose activations are quantized per row, and so take SmoothQuant's channel scales
SMOOTHED_MODES = ("int4", "w8a8_int8")
_MIN_CALIBRATION_TOKENS = 16
_QUANTIZERS = {"int8": quantize_int8, "int4": quantize_int4, "w8a8_int8": quantize_w8a8}


def check_mode(mode: str | None) -> str | None:
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown quantization {mode!r}; choose one of {', '.join(MODES)} (or none)")
    return mode


def _from_dense(weight: torch.Tensor, mode: str, input_max: torch.Tensor | None = None) -> QuantizedWeight:
    if input_max is not None:  # SmoothQuant's scales for activations per row
        blocks = _QUANTIZERS[mode](weight, channel_scales=channel_scales(input_max, weight))
    else:
        blocks = _QUANTIZERS[mode](weight)
    return QuantizedWeight(blocks, weight.shape[1], mode)


def quantize_decoder(decoder: Decoder, mode: str, gguf_path: str | None = None,
                     calibration: Sequence[int] | None = None) -> Decoder:
    """Every layer's qkv, o, gate_up and down, and the LM head, quantized in place.

    "int8" / "int4" / "w8a8_int8" quantize the loaded weights; "gguf" takes the file's own quantized tensors (the
    model must be a GGUF file), checked against the loaded weights so that a wrong mapping cannot pass.
    "int4" and "w8a8_int8" (activations per row) with `calibration` (token ids; load_model passes
    smoothing.CALIBRATION_TEXT's) first run them through the dense decoder for SmoothQuant's channel scales
    (smoothing.py); without, they quantize the activations as they come.
    The embedding lookup keeps the dense rows (it reads a few rows, not the matrix)."""
    check_mode(mode)
    maxima, head_max = {}, None
    if mode in SMOOTHED_MODES and calibration:
        vocab = decoder.embed.num_embeddings  # a tokenizer may know ids the model has no row for
        tokens = [t for t in calibration if 0 <= t < vocab]
        if len(tokens) >= _MIN_CALIBRATION_TOKENS:
            maxima, head_max = input_maxima(decoder, tokens)
        else:
            logger.warning("%s: %d calibration tokens in the vocabulary; activations quantized "
                           "without SmoothQuant's scales", mode, len(tokens))
    if decoder.device.type != "cpu":
        logger.warning("quantized linears run in torch on %s (exact, not fast): the kernels are for CPUs",
                       decoder.device)
    source = None
    if mode == "gguf":
        if gguf_path is None:
            raise ValueError('quantization="gguf" needs a GGUF model file (the gemma-3-270m alias is one)')
        source = GGUFTensors(gguf_path)
    names = list(LAYER_TENSORS)
    for i, layer in enumerate(tqdm(decoder.layers, desc=f"quantizing ({mode})", unit="layer", leave=False)):
        for name in names:
            dense: torch.nn.Linear = getattr(layer, name)
            if source is None:
                quantized = _from_dense(dense.weight, mode, maxima.get((i, name)))
            else:
                quantized = source.layer_linear(i, name)
                if quantized is None:
                    continue  # stored unquantized in the file: stays dense
                check_matches(f"layer {i} {name}", quantized, dense.weight)
            setattr(layer, name, QuantizedLinear(quantized, dense.bias))
    head = decoder.head_weight()
    if source is None:
        decoder.quantized_head = _from_dense(head, mode, head_max)
    else:
        decoder.quantized_head = source.lm_head()
        if decoder.quantized_head is not None:
            check_matches("LM head", decoder.quantized_head, head)
    return decoder.prepare()


def quantized_bytes(decoder: Decoder) -> dict[str, int]:
    """Bytes a decode step reads in linear weights: quantized and still dense."""
    weights = [getattr(layer, name).weight for layer in decoder.layers for name in LAYER_TENSORS]
    weights.append(decoder.quantized_head if decoder.quantized_head is not None else decoder.head_weight())
    out = {"quantized": 0, "dense": 0}
    for w in weights:
        out["quantized" if isinstance(w, QuantizedWeight) else "dense"] += w.nbytes
    return out
