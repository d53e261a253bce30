"""Linear layers whose rows do not depend on how many rows share the call.

Speculative decoding verifies K+1 tokens in one forward where plain decoding runs one (and several
sequences may share a forward); greedy output is identical only if each row comes out bit-identical
either way. No library promises that for bfloat16 on CPU: oneDNN's single-row (GEMV) path rounds
differently from its multi-row path, and where torch's bfloat16 GEMMs happen to be row-invariant they are
very slow. So we write our own kernels (kernels/, built once on first use with the C++ compiler): every
output element is one dot product accumulated in float32 in a fixed order, whatever the number of rows,
the blocking or the threads. On CPUs with AMX-BF16 the linears are amx_rows_linear.cpp (tile multiplies: many
rows cost about what one row costs); on CPUs with AVX512-BF16, bf16_rows_linear.cpp and, on weights packed once
(the layers' copies and the LM head, packed_head.py), bf16_packed_linear.cpp, with the same bits (each output
one VDPBF16PS chain over k, kernels/bf16_panels.h); on CPUs with AVX2 + FMA, avx2_rows_linear.cpp. Every build
runs attention on avx2_*.cpp (the attention scores, `qk_scores`, probs x values, and a batch's attention in one
call, each row over its own span; on the AMX build the scores and probs x values themselves on tiles,
amx_qk_scores.cpp and amx_probs_values.cpp, for head dims that are multiples of 32) and the argmax of logit rows
(`rows_argmax`). When a kernel exists, every bfloat16 CPU call goes through it, whatever its number of rows
(prefill chunks included), so a row's bits never depend on M. Elsewhere F.linear is used, a single row
run as two (the GEMV/GEMM rounding difference). SPECDEC_NO_KERNELS=1 disables the kernels.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

logger = logging.getLogger(__name__)


@cache  # read on every greedy step's head (a third of a millisecond each)
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


# ISA -> (extension name, sources, compiler flags); the names differ so the builds never share torch's cache
# attention, the rows' argmax and the greedy head's AVX2 screen: AVX2 in every build
_AVX2_SHARED = ["avx2_probs_values.cpp", "avx2_qk_scores.cpp", "avx2_attention_batch.cpp", "avx2_rows_argmax.cpp",
                "avx2_rms_norm.cpp", "avx2_gated_act.cpp", "avx2_softmax.cpp",
                "avx2_rope.cpp", "avx2_draft_attention.cpp", "avx2_decoder_layer.cpp",
                "avx2_draft_layer.cpp", "avx2_screened_columns.cpp", "screened_head_max.cpp",
                "rows_layer_linear.cpp"]
# hidden visibility, as the quantized kernel's builds: two builds in one process (scripts/attention_kernel_ab.py)
# never bind each other's inline functions, whose structs may differ
_AVX2_FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-fvisibility=hidden"]
_BUILDS = {
    # the AMX file enables its own ISA (a target pragma), so the attention files compile exactly as for AVX2
    "amx": ("specdec_cpu_kernels_amx", ["avx2_module.cpp", "amx_rows_linear.cpp", "amx_rows_argmax_linear.cpp",
                                                 "amx_packed_linear.cpp", "amx_screened_argmax.cpp", "amx_qk_scores.cpp",
                                                 "amx_probs_values.cpp",
                                                 *_AVX2_SHARED],
            [*_AVX2_FLAGS, "-DSPECDEC_AMX"]),
    # likewise bf16_rows_linear.cpp and bf16_packed_linear.cpp (AVX512-BF16 linears, packed_head.py), and the
    # head's int8 screen on AVX512-VNNI (SPECDEC_SCREEN_VNNI)
    "avx512_bf16": ("specdec_cpu_kernels_avx512bf16",
                    ["avx2_module.cpp", "bf16_rows_linear.cpp", "bf16_packed_linear.cpp", *_AVX2_SHARED],
                    [*_AVX2_FLAGS, "-DSPECDEC_PACKED_HEAD", "-DSPECDEC_SCREEN_VNNI"]),
    # avx2_lane_panels_linear.cpp: a second copy of the layers' weights for 5 rows and more (pack_weight)
    "avx2": ("specdec_cpu_kernels_avx2", ["avx2_module.cpp", "avx2_rows_linear.cpp", "avx2_lane_panels_linear.cpp",
                                         *_AVX2_SHARED],
             [*_AVX2_FLAGS, "-DSPECDEC_LANE_PANELS"]),
}


def _isas() -> list[str]:
    """The builds this CPU can run, best first."""
    flags = _cpu_flags()
    found = []
    if {"amx_bf16", "amx_tile", "avx512f", "avx2", "fma"} <= flags and os.environ.get("SPECDEC_NO_AMX") != "1":
        found.append("amx")
    if {"avx512_bf16", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        found.append("avx512_bf16")
    if {"avx2", "fma"} <= flags:
        found.append("avx2")
    chosen = os.environ.get("SPECDEC_BF16_KERNELS")  # one build by name (comparing builds on one CPU)
    if chosen:
        if chosen not in _BUILDS:
            raise ValueError(f"SPECDEC_BF16_KERNELS={chosen!r}: expected one of {', '.join(_BUILDS)}")
        if chosen not in found:
            raise ValueError(f"SPECDEC_BF16_KERNELS={chosen!r}: this CPU runs only {', '.join(found) or 'none'}")
        found = [chosen]
    return found


@cache
def _built() -> tuple[str | None, Any | None]:
    """(isa, module) of the best build that compiles and runs here; (None, None) without one."""
    if os.environ.get("SPECDEC_NO_KERNELS") == "1":
        return None, None
    for isa in _isas():
        name, sources, cflags = _BUILDS[isa]
        module = load_extension(name, sources, cflags, f"the bfloat16 row kernels for {isa}")
        if module is None:
            continue
        if isa == "amx" and not module.amx_ready():  # an OS that does not grant the tile state
            logger.warning("the CPU has AMX but the OS gives no tile state; using the next kernels")
            continue
        return isa, module
    return None, None


def kernel_isa() -> str | None:
    """"amx", "avx512_bf16" or "avx2": which kernels `kernel()` built; None when there are none."""
    return _built()[0]


def kernel() -> Any | None:
    """The compiled kernel module, or None (no AVX2 + FMA, no compiler, or SPECDEC_NO_KERNELS=1). Every
    build has rows_linear, probs_values, qk_scores and attention_batch.
    SPECDEC_NO_AMX=1 skips the AMX build; SPECDEC_BF16_KERNELS=avx2 (or avx512_bf16, amx) picks one build."""
    return _built()[1]


def load_extension(name: str, sources: list[str], cflags: list[str], what: str,
                   folder: Path | None = None) -> Any | None:
    """Builds (once, cached by torch) and loads a C++ extension from kernels/ (or `folder`: another commit's
    kernels, scripts/quant_kernel_ab.py); None when it cannot be built (no compiler, no ninja, ...): callers
    then take their exact but slower torch path."""
    try:
        from torch.utils.cpp_extension import load

        # torch builds with the `ninja` executable; the PyPI package puts it beside this interpreter, which
        # need not be on PATH when the venv is not activated.
        bin_dir = str(Path(sys.executable).parent)
        if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        folder = folder or Path(__file__).with_name("kernels")
        # the sources' and headers' hash in the name: two checkouts (or versions) never load each other's build
        files = [folder / s for s in sources] + sorted(folder.glob("*.h"))
        digest = hashlib.sha256(b"".join(f.read_bytes() for f in files) + " ".join(cflags).encode())
        logger.info("building %s (once, ~30 s)", what)
        return load(
            name=f"{name}_{digest.hexdigest()[:10]}",
            sources=[str(folder / source) for source in sources],
            extra_cflags=cflags,
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, no ninja, ...: the fallback is exact too, only slower
        logger.warning("%s unavailable (%s); using the torch path", what, exc)
        return None


# weight -> (its _version and data_ptr when packed, the packed copy): see pack_weight
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def pack_weight(weight: torch.Tensor) -> bool:
    """Keeps a copy of a bfloat16 CPU weight [N, K] beside it in a layout of the kernels that computes the same
    bits faster: the AMX tiles (kernels/amx_packed_linear.cpp, every row count), on AVX512-BF16 CPUs the 16-column
    panels (kernels/bf16_packed_linear.cpp, every row count: the dense kernel packs them as it goes) or, on AVX2
    CPUs, the lane panels (kernels/avx2_lane_panels_linear.cpp, 5 rows and more: verification and batches).
    `linear` then uses it for as long as the weight is unchanged (an in-place change or a new storage drops
    back to the dense path). False where there is no such kernel. Costs the weight's size once more in memory,
    so the decoder packs its layers' linears and not the embedding-sized LM head."""
    k = kernel()
    pack = (getattr(k, "amx_pack_weight", None) or getattr(k, "pack_bf16_panels", None)
            or getattr(k, "lane_panel_pack", None))
    if (pack is None or weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2
            or weight.numel() == 0):
        return False
    with torch.no_grad():
        _PACKED[weight] = ((weight._version, weight.data_ptr()), pack(weight.detach()))
    return True


def packed_copy(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy `linear` uses for `weight` (pack_weight), while the weight is unchanged; else None."""
    entry = _PACKED.get(weight)
    if entry is None or entry[0] != (weight._version, weight.data_ptr()):
        return None
    return entry[1]


def _packed_rows(k: Any, x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """float32 x @ weight.T through weight's packed copy (pack_weight): the bits of k.rows_linear(x, weight)."""
    if hasattr(k, "amx_packed_linear"):
        return k.amx_packed_linear(x, packed, weight.shape[0], False)
    if hasattr(k, "packed_rows_linear"):
        return k.packed_rows_linear(x, packed, weight.shape[0], 0, weight.shape[0])
    return k.lane_panel_linear(x, weight, packed)


def layer_linear_arguments(weights: list[torch.Tensor]) -> tuple[int, list[torch.Tensor]] | None:
    """For the one-call layers (decoder_layer_call, draft_layer_call) on bfloat16 weights: the address of the
    linear they call and its 4 tiles per weight (kernels/layer_linear.h), through the weights' packed copies
    when all have one, or as they are when none has; None without a kernel for that."""
    k = kernel()
    if k is None or not all(isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 for w in weights):
        return None
    copies = [packed_copy(w) for w in weights]
    empty = torch.empty(0)
    if all(c is not None for c in copies):
        # the AMX tiles or the AVX512-BF16 panels alone
        alone = (getattr(k, "amx_packed_layer_linear_address", None)
                 or getattr(k, "bf16_packed_layer_linear_address", None))
        if alone is not None:
            return int(alone()), [t for c in copies for t in (c, empty, empty, empty)]
        if hasattr(k, "lane_panel_layer_linear_address"):  # the weight (fewer than 5 rows) and its lane panels
            address = int(k.lane_panel_layer_linear_address())
            return address, [t for w, c in zip(weights, copies) for t in (w, c, empty, empty)]
    if all(c is None for c in copies) and hasattr(k, "rows_layer_linear_address"):  # as they are
        return int(k.rows_layer_linear_address()), [t for w in weights for t in (w, empty, empty, empty)]
    return None


def _kernel_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """float32 x @ weight.T (+ bias) through the kernel when it applies, else None."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu":
        return None
    k = kernel()
    if k is None:
        return None
    packed = packed_copy(weight)
    y = k.rows_linear(x, weight) if packed is None else _packed_rows(k, x, weight, packed)
    return y if bias is None else y.add_(bias.float())


def _quantized_rows(x: torch.Tensor, weight: Any, bias: torch.Tensor | None) -> torch.Tensor:
    """float32 x @ weight.T (+ bias) for a quantization.QuantizedWeight (row-independent on every device)."""
    y = weight.linear_float(x)
    return y if bias is None else y.add_(bias.float())


def linear_float(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) in float32, row-independent for bfloat16 on CPU; x is [M, K]. `weight` may be
    a quantization.QuantizedWeight."""
    if not isinstance(weight, torch.Tensor):
        return _quantized_rows(x, weight, bias)
    y = _kernel_rows(x, weight, bias)
    return y if y is not None else linear(x, weight, bias).float()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) in x's dtype, row-independent for bfloat16 on CPU; x is [M, K]. `weight` may be
    a quantization.QuantizedWeight."""
    if not isinstance(weight, torch.Tensor):
        if bias is None:
            return weight.linear_rows(x, x.dtype)
        return _quantized_rows(x, weight, bias).to(x.dtype)
    if bias is None and x.dtype == torch.bfloat16 and x.device.type == "cpu":
        k = kernel()
        if k is not None and hasattr(k, "rows_linear_bf16"):  # rounded in the kernel: no float32 output pass
            packed = packed_copy(weight)
            if packed is not None:
                return k.amx_packed_linear(x, packed, weight.shape[0], True)
            return k.rows_linear_bf16(x, weight)
    y = _kernel_rows(x, weight, bias)
    if y is not None:
        return y.to(torch.bfloat16)
    if x.shape[0] == 1 and x.dtype == torch.bfloat16:  # float32 is not exact anyway, and slow as two rows
        return F.linear(torch.cat((x, x)), weight, bias)[:1]
    return F.linear(x, weight, bias)


def module_linear(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)`, but without autograd through our row kernel (oneDNN's bf16 path is slow for a handful of
    rows): drafters' inference calls this, training keeps autograd."""
    if torch.is_grad_enabled():
        return layer(x)
    y = linear(x.reshape(-1, x.shape[-1]).to(layer.weight.dtype), layer.weight, layer.bias)
    return y.view(*x.shape[:-1], y.shape[-1])
