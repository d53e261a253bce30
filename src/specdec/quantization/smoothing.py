"""SmoothQuant's per-input-channel scales for `w8a8_int8` (Xiao et al., 2023): a few input channels of each
linear carry most of its activation range, and with one int8 scale per row those outliers leave the other
channels a handful of levels. Dividing each channel of x by t and multiplying the weight's column by t keeps
x @ W.T (up to rounding) and moves part of the range into the weights, which are quantized per output
channel: t_k = max|x_k| ** alpha / max|w_k| ** (1 - alpha).

The maxima come from one forward of the dense model over a short built-in text (CALIBRATION_TEXT, written
for this purpose: prose, dialogue, code, arithmetic, two other languages), so loading needs no data set.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.models import decoder as decoder_module
from specdec.models.decoder import Decoder
from specdec.quantization.gguf_weights import LAYER_TENSORS

ALPHA = 0.5
# the smallest maxima used: a channel never seen active keeps t near 1 rather than dividing by zero
_FLOOR = 1e-5

CALIBRATION_TEXT = """\
The harbour was quiet before dawn. A fisherman checked his nets twice, counted the floats, and wrote the
number in a notebook that smelled of salt and diesel. By seven the market had opened: crates of mackerel,
a stall selling bread and honey, and a radio announcing that the ferry to the islands would leave late.

"Are you coming to the meeting tonight?" asked Maria.
"Only if it finishes before nine," said Tom. "I still have to fix the bicycle and answer three emails."
"Then bring the report. We need the figures for March and April, and the cost of the new roof."

def moving_average(values, window):
    # the mean of each run of `window` values
    if window <= 0:
        raise ValueError("window must be positive")
    total = sum(values[:window])
    out = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        out.append(total / window)
    return out

Question: A train travels 240 km in 3 hours and then 150 km in 2 hours. What is its average speed?
Answer: It covers 240 + 150 = 390 km in 3 + 2 = 5 hours, so its average speed is 390 / 5 = 78 km per hour.

Steps to repot a plant: 1. water it the day before; 2. loosen the roots gently; 3. choose a pot 2-3 cm
wider; 4. add fresh soil and press it down; 5. keep it out of direct sun for a week.

Der Zug nach Berlin fährt um halb neun ab. Wir treffen uns am Bahnhof, gleich neben der Bäckerei.
Le musée ouvre à dix heures; l'entrée est gratuite le premier dimanche du mois.

In 1854 the physician John Snow mapped the cases of cholera around a water pump in London and showed that
the disease spread through contaminated water, not through bad air. His map is still taught today as an
early example of epidemiology and of how data, drawn clearly, can change a public decision.
"""


def input_maxima(decoder: Decoder, tokens: Sequence[int]) -> tuple[dict[tuple[int, str], torch.Tensor], torch.Tensor]:
    """max |x_k| over `tokens` of every layer linear's input ((layer, name) -> [in_features] float32) and of
    the LM head's (the final norm's output), from one forward of the dense decoder through its Python layer
    path (the one-call C++ layer would not show the linears' inputs)."""
    from specdec.models.runtime import NativeRuntime

    names = {id(getattr(layer, n).weight): (i, n) for i, layer in enumerate(decoder.layers) for n in LAYER_TENSORS}
    seen: dict[tuple[int, str], torch.Tensor] = {}
    dense_linear = decoder_module.linear

    def recording(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        key = names.get(id(weight))
        if key is not None:
            top = x.detach().float().abs().amax(0)
            seen[key] = top if key not in seen else torch.maximum(seen[key], top)
        return dense_linear(x, weight, bias)

    saved = [layer.layer_call_args for layer in decoder.layers]
    runtime = NativeRuntime(decoder)
    try:
        decoder_module.linear = recording
        for layer in decoder.layers:
            layer.layer_call_args = None
        runtime.reset(len(tokens) + 1)
        head_input = runtime.forward(list(tokens), logit_rows="last").final_hidden
    finally:
        decoder_module.linear = dense_linear
        for layer, args in zip(decoder.layers, saved):
            layer.layer_call_args = args
        runtime.release()
    missing = [f"layer {i} {n}" for i in range(len(decoder.layers)) for n in LAYER_TENSORS if (i, n) not in seen]
    if missing:
        raise RuntimeError(f"calibration saw no input of {', '.join(missing[:3])}")
    return seen, head_input.detach().float().abs().amax(0)


def channel_scales(input_max: torch.Tensor, weight: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """t [in_features] float32 (SmoothQuant's s): x / t and W * t (columns) give x @ W.T."""
    w_max = weight.detach().float().abs().amax(0).clamp_min(_FLOOR)
    return (input_max.float().clamp_min(_FLOOR) ** alpha / w_max ** (1 - alpha)).clamp_min(_FLOOR)
