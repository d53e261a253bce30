"""Each row's greedy token over a slice of a bfloat16 LM head, from the head's int8 copy and an exact rescore
of the few columns it cannot rule out, on CPUs without AMX-INT8 (greedy_argmax.head_screen covers those).

On an AVX2 CPU a greedy decode step of one row is bound by reading the head (Gemma 3's 262,144 x 640 bf16:
335 MB, as many bytes as its layers). kernels/avx2_screened_columns.cpp reads the int8 copy instead (half the
bytes) and returns, per row, the columns whose proven upper bound reaches the row's best lower bound; those
are scored with the head's own row kernel (`rows_linear`, as `Decoder.logits` scores token ids: every logit
the same number as the whole head gives), and the first maximum among them, in column order, is the whole
slice's: the same token and value as scoring every column. Its integer products grow with the rows while the
read does not, so calls of more than MAX_ROWS rows score the head as before; PACKED_MAX_ROWS for a head packed
for the AVX512-BF16 kernels (packed_head.py), whose wide products overtake the screen's sooner.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from specdec.models import fast_linear
from specdec.models.greedy_argmax import head_copy

# Rows up to which the screen is used: on a 2-core AVX2 EPYC, on Gemma 3's head and the model's own final
# hidden states, screened_max took 10 / 11 / 27 / 40 / 51 / 102 ms at 1 / 2 / 8 / 12 / 16 / 32 rows against the
# bf16 head's 23 / 25 / 50 / 69 / 84 / 144 ms (its integer products share each weight load across 8 rows)
MAX_ROWS = 32
# Rows up to which a packed head is screened: on a 2-core Zen 4 (AVX512-BF16, the screen's products on VNNI), on
# Gemma 3's head and its own hidden states, screened_max took 6.4 / 6.5 / 7.3 / 9.3 / 15.4 ms at 1 / 4 / 6 / 8 /
# 10 rows against the packed head's 11.3 / 10.8 / 11.1 / 12.8 / 14.1 ms
PACKED_MAX_ROWS = 8

# head weight -> ((its _version and data_ptr when copied), int8_head_tiles' parts or None)
_COPIES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def column_screen(head: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The int8 copy of a bfloat16 LM head [V, H] in tiles for screened_columns (half the head's bytes, kept
    beside it), made once per weight version; None without the kernels and where head_copy gives none."""
    k = fast_linear.kernel()
    if k is None or not hasattr(k, "screened_max"):
        return None
    return head_copy(head, _COPIES, k.int8_head_tiles)


def screened_max_call(*args: object) -> list[torch.Tensor]:
    """The kernel's screened_max (a seam the tests count calls through)."""
    return fast_linear.kernel().screened_max(*args)


def screened_max(hidden: torch.Tensor, head: torch.Tensor, columns: slice,
                 most_rows: int = MAX_ROWS) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(values [n] float32, indices [n] int64 within `columns`): each row's greedy_argmax over the head's
    logits in `columns` (a contiguous slice) and the logit there, where the screen applies; else None. The
    candidates are scored by the head's own row kernel (`rows_linear`, as `Decoder.logits` scores token ids),
    all in one C++ call (kernels/screened_head_max.cpp). Calls of more than `most_rows` rows get None."""
    if hidden.dtype != torch.bfloat16 or hidden.dim() != 2 or not 1 <= hidden.shape[0] <= most_rows:
        return None
    start, stop, step = columns.indices(head.shape[0])
    if step != 1 or stop <= start:
        return None
    parts = column_screen(head)
    if parts is None:
        return None
    found = screened_max_call(hidden, *parts, start, stop, head)
    if not found:  # a non-finite row, or flat rows that keep most columns
        return None
    return found[0], found[1]
