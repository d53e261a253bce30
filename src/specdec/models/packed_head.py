"""The LM head's bfloat16 weight packed in 16-column panels, for the AVX512-BF16 kernels
(kernels/bf16_packed_linear.cpp).

At a batch's decode step the LM head is most of the arithmetic (262,144 x 640 for Gemma 3 270M, 16-32 rows).
The dense kernel (bf16_rows_linear.cpp) gives the same bits but packs the panels as it goes; packed once, the
head skips that work on every call. The packed copy costs the head's size once more in memory (the embedding
keeps the dense rows: token lookup, the drafters and the greedy head's int8 screen read them).

Each logit is the same chain of VDPBF16PS steps over k wherever its column sits, so any slice or any set of
token ids scores exactly what the whole head gives (greedy early exit and column_screen.py rely on it), and no
row depends on how many rows share the call.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from specdec.models import fast_linear


class PackedHead:
    """`linear_float` / `linear_columns`, as quantization.QuantizedWeight offers them, over a dense bf16 head."""

    def __init__(self, weight: torch.Tensor, kernel: Any) -> None:  # kernel: the compiled extension module
        self.weight = weight  # the dense rows, shared with the embedding or lm_head (for token-id columns)
        self.kernel = kernel
        self.out_features = int(weight.shape[0])
        self.version = weight._version  # in-place changes bump it: the panels are then stale
        self.panels = kernel.pack_bf16_panels(weight.detach())

    def packs(self, weight: torch.Tensor) -> bool:
        """Whether these panels are `weight` as it is now (the same tensor, not changed in place since)."""
        return weight is self.weight and weight._version == self.version

    @staticmethod
    def build(weight: torch.Tensor) -> PackedHead | None:
        """A packed head where the kernels have one (bfloat16 on a CPU with AVX512-BF16), else None.
        SPECDEC_NO_PACKED_HEAD=1 keeps the row kernel."""
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2:
            return None
        if os.environ.get("SPECDEC_NO_PACKED_HEAD") == "1":  # the row kernel instead (A/B measurements)
            return None
        k = fast_linear.kernel()
        if k is None or not hasattr(k, "packed_rows_linear"):
            return None
        return PackedHead(weight, k)

    def linear_float(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, in_features] @ W.T as float32 [M, out_features]."""
        return self.kernel.packed_rows_linear(x, self.panels, self.out_features, 0, self.out_features)

    def linear_columns(self, x: torch.Tensor, columns: slice | torch.Tensor) -> torch.Tensor:
        """linear_float(x)[:, columns] with the same bits, computing (about) only those columns: a range through
        the panels covering it, token ids through panels packed for them alone."""
        if isinstance(columns, slice) and columns.step in (None, 1):
            start, stop, _ = columns.indices(self.out_features)
            return self.kernel.packed_rows_linear(x, self.panels, self.out_features, start, max(stop, start))
        rows = self.weight.detach()[columns]
        n = int(rows.shape[0])
        return self.kernel.packed_rows_linear(x, self.kernel.pack_bf16_panels(rows), n, 0, n)
