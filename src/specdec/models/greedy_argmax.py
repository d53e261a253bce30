"""The target's greedy token at each logit row, as torch.argmax picks it (the first maximum, or the first NaN).

On the CPU the kernels' `rows_argmax` reads each row once with vector compares, rows on the threads: over a
262k-token vocabulary torch's argmax took about 0.22 ms a row, 7 ms of a batch-32 decode step. Elsewhere
(no kernels, other dtypes or devices) torch.argmax.
"""

from __future__ import annotations

import torch

from specdec.models import fast_linear


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [...] int64: the index of each row's maximum (ties: the first)."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu" and logits.dim() >= 1 and logits.shape[-1] > 0:
        k = fast_linear.kernel()
        if k is not None and hasattr(k, "rows_argmax"):
            rows = logits.reshape(-1, logits.shape[-1])
            return k.rows_argmax(rows).view(logits.shape[:-1])
    return logits.argmax(dim=-1)


def fused_greedy_argmax(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor | None:
    """greedy_argmax(hidden @ head.T) for bfloat16 rows [R, H] and head [V, H] without materializing the
    logits, where the kernels have it (AMX: kernels/amx_rows_argmax_linear.cpp, each logit rounded as the
    head's own kernel rounds it); None elsewhere. At a batch's verification step the float32 logits are
    1 MiB a row for a 262k vocabulary: writing and re-reading them cost more than the head's arithmetic."""
    if hidden.dtype != torch.bfloat16 or head.dtype != torch.bfloat16 or hidden.device.type != "cpu" or hidden.dim() != 2:
        return None
    k = fast_linear.kernel()
    if k is None or not hasattr(k, "rows_argmax_linear") or head.shape[0] == 0 or hidden.shape[1] == 0:
        return None
    return k.rows_argmax_linear(hidden, head)
