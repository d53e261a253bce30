"""The quantized-linear kernels, built once on first use: the best this CPU runs, chosen like fast_linear's
bf16 builds. Every build gives the bits of reference.reference_linear, so which one runs changes speed only.
Each reads weights packed in tiles of its own width (quantized_weight.pack_tiles):

  amx_int8     the VNNI source built with SPECDEC_AMX_INT8: calls of 16 rows or more (32 for u4) run their
               whole 16-row tiles on AMX-INT8 (kernels/amx_int8_quant_tiles.h), the rest on the VNNI loop;
               w8a8_int8 (s8r) every call and int4 (u4r) calls of 6 rows or more run on AMX (the
               avx512_*_rows.h headers); the same tiles and bits
  avx512_vnni  kernels/avx512_vnni_quant_linear.cpp, tiles of 16 columns (vpdpbusd; AVX512 F/BW/VL + VNNI)
  avx2         kernels/avx2_quant_linear.cpp, tiles of 8 columns
Both read float16 scales and mins where they are exact, and Q5_0's quants in 5 bits.

SPECDEC_NO_AMX=1 skips the AMX build (as it does fast_linear's); SPECDEC_NO_VNNI=1 skips both AVX512 builds;
SPECDEC_NO_KERNELS=1 skips all.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from specdec.models import fast_linear

# hidden visibility: the builds' inline functions and templates bind within their own library, so two builds
# in one process (the A/B scripts, the tests' build comparisons) never call into each other's, whose structs
# may differ, and calls skip the PLT
_AVX2_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-fvisibility=hidden"]
_VNNI_FLAGS = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"})
# ISA -> (extension name, source, CPU flags it needs, tile width in columns, extra compiler flags); the AVX512
# sources enable their own ISAs (target pragmas), so all compile with AVX2's flags
QUANT_BUILDS: dict[str, tuple[str, str, frozenset[str], int, tuple[str, ...]]] = {
    "amx_int8": ("specdec_quant_kernels_amx", "avx512_vnni_quant_linear.cpp",
                 _VNNI_FLAGS | {"amx_tile", "amx_int8"}, 16, ("-DSPECDEC_AMX_INT8",)),
    "avx512_vnni": ("specdec_quant_kernels_vnni", "avx512_vnni_quant_linear.cpp", _VNNI_FLAGS, 16, ()),
    "avx2": ("specdec_quant_kernels", "avx2_quant_linear.cpp", frozenset({"avx2", "fma", "f16c"}), 8, ()),
}


def quant_isas() -> list[str]:
    """The builds this CPU can run, best first (SPECDEC_NO_AMX=1 leaves the AMX one out, SPECDEC_NO_VNNI=1 both
    AVX512 ones)."""
    flags = fast_linear._cpu_flags()
    skip = set()
    if os.environ.get("SPECDEC_NO_AMX") == "1":
        skip.add("amx_int8")
    if os.environ.get("SPECDEC_NO_VNNI") == "1":
        skip |= {"amx_int8", "avx512_vnni"}
    return [isa for isa, (_, _, needs, _, _) in QUANT_BUILDS.items() if needs <= flags and isa not in skip]


@cache
def quant_kernel_build(isa: str) -> Any | None:
    """One build's module (the tests compare them), or None when it cannot be built or run here."""
    name, source, needs, _, extra = QUANT_BUILDS[isa]
    if not needs <= fast_linear._cpu_flags():
        return None
    return fast_linear.load_extension(name, [source], _AVX2_FLAGS + list(extra), f"the quantized linear kernel for {isa}")


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
    """"amx_int8", "avx512_vnni" or "avx2": which build quant_kernel() returns; None without one."""
    return _built()[0]


def quant_tile_width(isa: str | None = None) -> int:
    """Columns per tile of `isa`'s layout (default: the build quant_kernel() returns; 8 without one)."""
    isa = isa or quant_kernel_isa()
    return QUANT_BUILDS[isa][3] if isa else 8
