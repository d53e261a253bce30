"""The quantized-linear kernels, built once on first use: the best this CPU runs, chosen like fast_linear's
bf16 builds. Every build gives the bits of reference.reference_linear, so which one runs changes speed only.
Each reads weights packed in tiles of its own width (quantized_weight.pack_tiles):

  avx512_vnni  kernels/avx512_vnni_quant_linear.cpp, tiles of 16 columns (vpdpbusd; AVX512 F/BW/VL + VNNI)
  avx2         kernels/avx2_quant_linear.cpp, tiles of 8 columns
Both read float16 scales and mins where they are exact, and Q5_0's quants in 5 bits.

SPECDEC_NO_VNNI=1 skips the VNNI build; SPECDEC_NO_KERNELS=1 skips both.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from specdec.models import fast_linear

_AVX2_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp"]
# ISA -> (extension name, source, CPU flags it needs, tile width in columns); the VNNI file enables its own
# ISA (a target pragma), so both compile with AVX2's flags
QUANT_BUILDS: dict[str, tuple[str, str, frozenset[str], int]] = {
    "avx512_vnni": ("specdec_quant_kernels_vnni", "avx512_vnni_quant_linear.cpp",
                    frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}), 16),
    "avx2": ("specdec_quant_kernels", "avx2_quant_linear.cpp", frozenset({"avx2", "fma", "f16c"}), 8),
}


def quant_isas() -> list[str]:
    """The builds this CPU can run, best first (SPECDEC_NO_VNNI=1 leaves the VNNI one out)."""
    flags = fast_linear._cpu_flags()
    skip = {"avx512_vnni"} if os.environ.get("SPECDEC_NO_VNNI") == "1" else set()
    return [isa for isa, (_, _, needs, _) in QUANT_BUILDS.items() if needs <= flags and isa not in skip]


@cache
def quant_kernel_build(isa: str) -> Any | None:
    """One build's module (the tests compare them), or None when it cannot be built or run here."""
    name, source, needs, _ = QUANT_BUILDS[isa]
    if not needs <= fast_linear._cpu_flags():
        return None
    return fast_linear.load_extension(name, [source], _AVX2_FLAGS, f"the quantized linear kernel for {isa}")


@cache
def _built() -> tuple[str | None, Any | None]:
    if os.environ.get("SPECDEC_NO_KERNELS") == "1":
        return None, None
    for isa in quant_isas():
        module = quant_kernel_build(isa)
        if module is not None:
            return isa, module
    return None, None


def quant_kernel() -> Any | None:
    """The compiled module, or None (no AVX2, no compiler, or SPECDEC_NO_KERNELS=1): then
    reference.reference_linear computes the same bits in torch, more slowly."""
    return _built()[1]


def quant_kernel_isa() -> str | None:
    """"avx512_vnni" or "avx2": which build quant_kernel() returns; None without one."""
    return _built()[0]


def quant_tile_width(isa: str | None = None) -> int:
    """Columns per tile of `isa`'s layout (default: the build quant_kernel() returns; 8 without one)."""
    isa = isa or quant_kernel_isa()
    return QUANT_BUILDS[isa][3] if isa else 8
