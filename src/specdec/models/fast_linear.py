"""Linear layers whose rows do not depend on how many rows share the call.

Speculative decoding verifies K+1 tokens in one forward where plain decoding runs one; greedy output is
identical only if each row comes out bit-identical either way. On CPUs with AVX512-BF16 a small kernel
of ours (kernels/bf16_rows_linear.cpp, built once on first use) computes bfloat16 rows with a fixed
accumulation order, and also runs much closer to memory bandwidth than oneDNN does for a few rows.
Elsewhere F.linear is used; on CPU its single-row GEMV path rounds differently from its multi-row
path, so a single row is run as two. Prefill-sized calls (more than MAX_KERNEL_ROWS rows) use F.linear:
they are never compared row by row with anything.
"""

from __future__ import annotations

import logging
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

MAX_KERNEL_ROWS = 64  # covers every decode and verification forward (see engine.loop.MAX_TOKENS_PER_FORWARD)


def _cpu_has_avx512_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f in flags for f in ("avx512_bf16", "avx512bw", "avx512vl"))


@cache
def kernel() -> Any | None:
    """The compiled kernel module, or None (no AVX512-BF16, no compiler, or SPECDEC_NO_KERNELS=1)."""
    if os.environ.get("SPECDEC_NO_KERNELS") == "1" or not _cpu_has_avx512_bf16():
        return None
    try:
        from torch.utils.cpp_extension import load

        # torch builds with the `ninja` executable; the PyPI package puts it beside this interpreter, which
        # need not be on PATH when the venv is not activated.
        bin_dir = str(Path(sys.executable).parent)
        if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        folder = Path(__file__).with_name("kernels")
        logger.info("building the bfloat16 row kernels (once, ~30 s)")
        return load(
            name="specdec_cpu_kernels",
            sources=[str(folder / "bf16_rows_linear.cpp"), str(folder / "probs_values.cpp")],
            extra_cflags=["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, no ninja, ...: the fallback is exact too, only slower
        logger.warning("bfloat16 row kernel unavailable (%s); using F.linear", exc)
        return None


def _kernel_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """float32 x @ weight.T (+ bias) through the kernel when it applies, else None."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.shape[0] > MAX_KERNEL_ROWS:
        return None
    k = kernel()
    if k is None:
        return None
    y = k.rows_linear(x, weight)
    return y if bias is None else y.add_(bias.float())


def linear_float(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) in float32, row-independent for bfloat16 on CPU; x is [M, K]."""
    y = _kernel_rows(x, weight, bias)
    return y if y is not None else linear(x, weight, bias).float()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) in x's dtype, row-independent for bfloat16 on CPU; x is [M, K]."""
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
