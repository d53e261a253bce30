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

from collections.abc import Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from specdec.models import fast_linear
from specdec.models.greedy_argmax import greedy_argmax, head_copy

# Rows up to which the screen is used: on a 2-core AVX2 EPYC, on Gemma 3's head and the model's own final
# hidden states, screened_max took 10 / 11 / 27 / 40 / 51 / 102 ms at 1 / 2 / 8 / 12 / 16 / 32 rows against the
# bf16 head's 23 / 25 / 50 / 69 / 84 / 144 ms (its integer products share each weight load across 8 rows)
MAX_ROWS = 32

# head weight -> ((its _version and data_ptr when copied), int8_head_tiles' parts or None)
_COPIES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def column_screen(head: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The int8 copy of a bfloat16 LM head [V, H] in tiles for screened_columns (half the head's bytes, kept
    beside it), made once per weight version; None without the kernels and where head_copy gives none."""
    k = fast_linear.kernel()
    if k is None or not hasattr(k, "screened_columns"):
        return None
    return head_copy(head, _COPIES, k.int8_head_tiles)


def screened_columns_call(*args: object) -> list[torch.Tensor]:
    """The kernel's screened_columns (a seam the tests count calls through)."""
    return fast_linear.kernel().screened_columns(*args)


HeadScores = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (rows [n, H], token ids [c]) -> logits [n, c]


def screened_max(hidden: torch.Tensor, head: torch.Tensor, columns: slice,
                 score: HeadScores) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(values [n] float32, indices [n] int64 within `columns`): each row's greedy_argmax over the head's
    logits in `columns` (a contiguous slice) and the logit there, where the screen applies; else None.
    `score(rows [n, H], token ids [c])` gives the head's logits of those ids, as its whole-head scoring does."""
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
    # every row's candidates scored in one call over their union (each logit is the same number whatever
    # else is scored beside it); a row's own candidates are ascending, so its first maximum among them is
    # the slice's first maximum
    union, where = torch.unique(ids, sorted=True, return_inverse=True)
    logits = score(hidden, union)
    own = torch.zeros(logits.shape, dtype=torch.bool)
    own[torch.repeat_interleave(torch.arange(hidden.shape[0]), offsets.diff()), where] = True
    logits = logits.masked_fill(~own, float("-inf"))
    best = greedy_argmax(logits)
    return logits.gather(1, best[:, None])[:, 0], union[best] - start
