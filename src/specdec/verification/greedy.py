from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.models.greedy_argmax import greedy_argmax
from specdec.verification.result import Verification


def verify_greedy(draft: Sequence[int], target_logits: torch.Tensor) -> Verification:
    """Temperature 0: keep draft tokens while they equal the target's argmax; then emit the argmax.

    target_logits: [k + 1, V], row i scoring the token after draft token i - 1 (row 0: after the context).
    """
    if target_logits.shape[0] != len(draft) + 1:
        raise ValueError(f"need {len(draft) + 1} rows of target logits for {len(draft)} draft tokens")
    target = greedy_argmax(target_logits).tolist()
    n = 0
    while n < len(draft) and draft[n] == target[n]:
        n += 1
    return Verification(num_accepted=n, next_token=target[n])
