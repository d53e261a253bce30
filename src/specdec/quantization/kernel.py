"""The AVX2 quantized-linear kernel (kernels/avx2_quant_linear.cpp), built once on first use."""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from specdec.models import fast_linear


@cache
def quant_kernel() -> Any | None:
    """The compiled module, or None (no AVX2, no compiler, or SPECDEC_NO_KERNELS=1): then
    reference.reference_linear computes the same bits in torch, more slowly."""
    if os.environ.get("SPECDEC_NO_KERNELS") == "1" or not {"avx2", "fma"} <= fast_linear._cpu_flags():
        return None
    return fast_linear.load_extension(
        "specdec_quant_kernels", ["avx2_quant_linear.cpp"],
        ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp"], "the quantized linear kernel for AVX2")
