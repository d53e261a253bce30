"""A drafter's linears on int8 weights for drafting on CPU: speculative_config's `quantization`.

Why: a drafting step multiplies a handful of rows (one a sequence in a chain, a tree level's top-k), so on CPU
it is bound by reading the weights, as a target's decode step is. EAGLE-3's layer and its 8,192-row head are
about 23 MB in bfloat16, read five to ten times a step. int8 per output channel with the activations
quantized per row (quantization/'s `w8a8_int8` kernels) reads half of that: a tree's drafting on the default
model went from 7.3 to 4.8 ms a step (docs/long-context-runs.md); MTP's blocks and head run the same way.
The drafter's proposals change a little, since its arithmetic is no longer bfloat16's; the output does not,
since the target verifies every token.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import torch

from specdec.quantization.kernel import quant_kernel, quant_kernel_isa
from specdec.quantization.quantized_weight import QuantizedWeight
from specdec.quantization.reference import BLOCK
from specdec.quantization.weight_quantizers import MAX_W8A8_IN_FEATURES, quantize_w8a8

AUTO, NONE, W8A8 = "auto", "none", "w8a8_int8"
MODES = (AUTO, NONE, W8A8)
# The builds whose int8 kernels were measured faster than the bfloat16 ones on a drafter's few rows, per
# drafter (uses_int8's `fast_builds`). EAGLE-3's layer and head rows: every build; on a 2-core AVX2 EPYC,
# end to end on `other_kinds`, its chain went from 1.75x to 1.95x plain (docs/benchmarks.md, 2026-12-07).
# MTP's blocks: AVX512-VNNI and AMX only; on that EPYC they fell from 1.28x to 1.05x.
EVERY_BUILD = ("avx2", "avx512_vnni", "amx_int8")
VNNI_BUILDS = ("avx512_vnni", "amx_int8")
_ROW_KIND = 3  # the kernels' kind id of s8r (int8 per channel, x per row)


def mode_problems(mode: object) -> list[str]:
    if mode is not None and mode not in MODES:  # None (JSON null, vLLM's "not quantized") is "none"
        return [f"quantization must be one of {', '.join(map(repr, MODES))}, got {mode!r}"]
    return []


def _kernel_runs_int8() -> bool:
    module = quant_kernel()
    return module is not None and _ROW_KIND in getattr(module, "quant_linear_row_kinds", ())


def uses_int8(mode: str | None, device: torch.device, fast_builds: tuple[str, ...] = VNNI_BUILDS) -> bool:
    """Whether a drafter on `device` runs its linears on int8 copies: "auto" where this CPU's int8 kernels
    are among the drafter's `fast_builds`, "w8a8_int8" wherever a kernel runs them (else a ValueError: the
    reference would be slower than bfloat16), "none" (or None) never."""
    if mode is None or mode == NONE:
        return False
    cpu_kernel = device.type == "cpu" and _kernel_runs_int8()
    if mode == AUTO:
        return cpu_kernel and quant_kernel_isa() in fast_builds
    if not cpu_kernel:
        raise ValueError(f'a drafter\'s quantization "{W8A8}" needs the CPU int8 kernels (a target on the CPU, '
                         'with AVX2 and a compiler); use "none" or "auto"')
    return True


def shape_problems(in_features: list[int]) -> list[str]:
    """Why linears of these input sizes cannot have int8 copies (the kernels read whole blocks of 32)."""
    bad = [n for n in in_features if n % BLOCK or n > MAX_W8A8_IN_FEATURES]
    if bad:
        return [f"int8 drafter weights need input sizes that are multiples of {BLOCK} (at most "
                f"{MAX_W8A8_IN_FEATURES}); this drafter has {', '.join(map(str, bad))}"]
    return []


class Int8Capable(Protocol):
    def int8_problems(self) -> list[str]: ...
    def use_int8_weights(self) -> object: ...


D = TypeVar("D", bound=Int8Capable)


def with_int8_weights(drafter: D, mode: str | None, int8: bool) -> D:
    """The freshly loaded `drafter`, on int8 copies where `int8` (uses_int8's answer for `mode`): "auto" keeps
    bfloat16 where its shapes do not fit the int8 kernels, "w8a8_int8" says why (use_int8_weights raises)."""
    if int8 and (mode == W8A8 or not drafter.int8_problems()):
        drafter.use_int8_weights()
    return drafter


class Int8Copies:
    """int8 copies (w8a8: one scale per output channel, x quantized per row) of a drafter's weights, each
    made on first use and again when its weight changes (a fine-tune in place)."""

    def __init__(self) -> None:
        self._copies: dict[str, tuple[tuple[int, int], QuantizedWeight]] = {}

    def of(self, name: str, weight: torch.Tensor) -> QuantizedWeight:
        key = (weight.data_ptr(), weight._version)
        held = self._copies.get(name)
        if held is None or held[0] != key:
            blocks = quantize_w8a8(weight.detach().float().cpu())
            held = self._copies[name] = (key, QuantizedWeight(blocks, weight.shape[1], W8A8))
        return held[1]
