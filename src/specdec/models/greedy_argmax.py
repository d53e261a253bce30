"""The target's greedy token at each logit row, as torch.argmax picks it (the first maximum, or the first NaN).

On the CPU the kernels' `rows_argmax` reads each row once with vector compares, rows on the threads: over a
262k-token vocabulary torch's argmax took about 0.22 ms a row, 7 ms of a batch-32 decode step. Elsewhere
(no kernels, other dtypes or devices) torch.argmax.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from specdec.models import fast_linear

# head weight -> ((its _version and data_ptr when screened), amx_int8_head's parts or None): see head_screen
_SCREENS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [...] int64: the index of each row's maximum (ties: the first)."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu" and logits.dim() >= 1 and logits.shape[-1] > 0:
        k = fast_linear.kernel()
        if k is not None and hasattr(k, "rows_argmax"):
            rows = logits.reshape(-1, logits.shape[-1])
            return k.rows_argmax(rows).view(logits.shape[:-1])
    return logits.argmax(dim=-1)


def head_copy(head: torch.Tensor, copies: WeakIdKeyDictionary,
              make: Callable[[torch.Tensor], list[torch.Tensor]]) -> tuple[torch.Tensor, ...] | None:
    """make(head)'s parts (an int8 copy of a bfloat16 LM head [V, H] for a greedy screen), kept in `copies`
    once per weight version; None where no screen applies: a head being trained, not a CPU bfloat16 matrix,
    SPECDEC_NO_HEAD_SCREEN=1, or make() returned nothing (a non-finite weight)."""
    if (os.environ.get("SPECDEC_NO_HEAD_SCREEN") == "1" or head.requires_grad or head.dtype != torch.bfloat16
            or head.device.type != "cpu" or head.dim() != 2 or head.numel() == 0):
        return None
    key = (head._version, head.data_ptr())
    entry = copies.get(head)
    if entry is None or entry[0] != key:
        with torch.no_grad():
            parts = make(head.detach().contiguous())
        entry = (key, tuple(parts) if parts else None)
        copies[head] = entry
    return entry[1]


def head_screen(head: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The int8 copy of a bfloat16 LM head [V, H] that kernels/amx_screened_argmax.cpp screens columns with
    (half the head's bytes, kept beside it), made once per weight version; None without AMX-INT8 and where
    head_copy gives none."""
    k = fast_linear.kernel()
    if k is None or not hasattr(k, "amx_screened_argmax") or "amx_int8" not in fast_linear._cpu_flags():
        return None
    return head_copy(head, _SCREENS, k.amx_int8_head)


def fused_greedy_argmax(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor | None:
    """greedy_argmax(hidden @ head.T) for bfloat16 rows [R, H] and head [V, H] without materializing the
    logits, where the kernels have it (AMX: kernels/amx_rows_argmax_linear.cpp, each logit rounded as the
    head's own kernel rounds it); None elsewhere. At a batch's verification step the float32 logits are
    1 MiB a row for a 262k vocabulary: writing and re-reading them cost more than the head's arithmetic.
    With AMX-INT8, the head's int8 copy (head_screen) rules out every column that provably cannot be a row's
    maximum and only the rest are computed in bfloat16 (kernels/amx_screened_argmax.cpp): the same answer
    from half the bytes."""
    if hidden.dtype != torch.bfloat16 or head.dtype != torch.bfloat16 or hidden.device.type != "cpu" or hidden.dim() != 2:
        return None
    k = fast_linear.kernel()
    if k is None or not hasattr(k, "rows_argmax_linear") or head.shape[0] == 0 or hidden.shape[1] == 0:
        return None
    screen = head_screen(head)
    if screen is not None:
        return k.amx_screened_argmax(hidden, *screen, head)[0]
    return k.rows_argmax_linear(hidden, head)
