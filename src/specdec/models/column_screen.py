"""Each row's greedy token over a slice of a bfloat16 LM head, from the head's int8 copy and an exact rescore
of the few columns it cannot rule out, on CPUs without AMX-INT8 (greedy_argmax.head_screen covers those).

On an AVX2 CPU a greedy decode step of one row is bound by reading the head (Gemma 3's 262,144 x 640 bf16:
335 MB, as many bytes as its layers). kernels/avx2_screened_columns.cpp reads the int8 copy instead (half the
bytes) and returns, per row, the columns whose proven upper bound reaches the row's best lower bound; those
are scored with the head's own row kernel (`Decoder.logits` over token ids: every logit the same number as
the whole head gives), and the first maximum among them, in column order, is the whole slice's: the same
token and value as scoring every column. Its integer products grow with the rows while the read does not,
so calls of more than MAX_ROWS rows score the head as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from specdec.models import fast_linear
from specdec.models.greedy_argmax import greedy_argmax

# Rows up to which the screen pays: on a 2-core AVX2 EPYC, on Gemma 3's head, the bf16 head took 25-28 ms at
# 1-4 rows and the screen 10.0 / 14.5 / 21.7 / 28.1 ms (its integer products cost ~5-7 ms a row)
MAX_ROWS = 3

# head weight -> ((its _version and data_ptr when copied), int8_head_tiles' parts or None)
_COPIES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def column_screen(head: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The int8 copy of a bfloat16 LM head [V, H] in tiles for screened_columns (half the head's bytes, kept
    beside it), made once per weight version; None where it does not apply: no kernels, a head being
    trained, a non-finite weight, or SPECDEC_NO_HEAD_SCREEN=1."""
    k = fast_linear.kernel()
    if (k is None or not hasattr(k, "screened_columns") or os.environ.get("SPECDEC_NO_HEAD_SCREEN") == "1"
            or head.requires_grad or head.dtype != torch.bfloat16 or head.device.type != "cpu" or head.dim() != 2
            or head.numel() == 0):
        return None
    key = (head._version, head.data_ptr())
    entry = _COPIES.get(head)
    if entry is None or entry[0] != key:
        with torch.no_grad():
            parts = k.int8_head_tiles(head.detach().contiguous())
        entry = (key, tuple(parts) if parts else None)
        _COPIES[head] = entry
    return entry[1]


def screened_columns_call(*args: object) -> list[torch.Tensor]:
    """The kernel's screened_columns (a seam the tests count calls through)."""
    return fast_linear.kernel().screened_columns(*args)


HeadScores = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (rows [n, H], token ids [c]) -> logits [n, c]


def screened_max(hidden: torch.Tensor, head: torch.Tensor, columns: slice,
                 score: HeadScores) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(values [n] float32, indices [n] int64 within `columns`): each row's greedy_argmax over the head's
    logits in `columns` (a contiguous slice) and the logit there, where the screen applies; else None.
    `score(rows [1, H], token ids [c])` gives the head's logits of those ids, as its whole-head scoring does."""
    if hidden.dtype != torch.bfloat16 or hidden.dim() != 2 or not 1 <= hidden.shape[0] <= MAX_ROWS:
        return None
    start, stop, step = columns.indices(head.shape[0])
    if step != 1 or stop <= start:
        return None
    parts = column_screen(head)
    if parts is None:
        return None
    found = screened_columns_call(hidden.contiguous(), *parts, start, stop)
    if not found:  # a non-finite row, or flat rows that keep most columns
        return None
    ids, offsets = found
    values = torch.empty(hidden.shape[0], dtype=torch.float32)
    indices = torch.empty(hidden.shape[0], dtype=torch.long)
    for m, (lo, hi) in enumerate(zip(offsets.tolist(), offsets[1:].tolist())):
        candidates = ids[lo:hi]
        logits = score(hidden[m : m + 1], candidates)
        i = int(greedy_argmax(logits)[0])  # ascending ids: the first maximum among them is the slice's
        values[m] = logits[0, i]
        indices[m] = candidates[i] - start
    return values, indices
