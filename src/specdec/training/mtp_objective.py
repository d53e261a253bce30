"""MTP training objective: every depth at once (depth k reads depth k - 1's outputs over the whole
sequence, see mtp_model.unroll), each scored against the target's distribution.

Depth k at position i predicts token i + k + 1; with greedy self-distilled data its soft target is the
target's distribution at position i + k over the draft vocabulary, scored where token i + k + 1 is a
response token in the draft vocabulary (prompt tokens too with `score_prompt`, see training/labels.py).
Depth k is weighted beta**(k - 1), normalised (FastMTP /
speculators: [0.51, 0.31, 0.18] for three steps with beta 0.6).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from specdec.drafting.mtp_model import MTPDrafter, unroll
from specdec.drafting.vocab_map import head_logits
from specdec.training.labels import scored_labels
from specdec.training.trainer import StepMetrics


def step_weights(steps: int, beta: float) -> list[float]:
    raw = [beta**k for k in range(steps)]
    return [w / sum(raw) for w in raw]


def mtp_loss(drafter: MTPDrafter, ids: torch.Tensor, prompt_len: int, final_hidden: torch.Tensor,
             weights: Sequence[float], t2d_index: torch.Tensor,
             score_prompt: bool = False) -> tuple[torch.Tensor, StepMetrics]:
    """Loss of one sequence `ids` [T] whose tokens from `prompt_len` on the target wrote greedily."""
    T = ids.shape[0]
    first = 0 if score_prompt else max(prompt_len - 1, 0)  # positions whose next token is scored
    assert drafter._target is not None
    with torch.no_grad():
        target = drafter.target
        normed = final_hidden[first : T - 1]
        target_p = torch.softmax(head_logits(normed, drafter._target[1], target.arch.final_logit_softcap), dim=-1)
    states = unroll(drafter, ids, final_hidden.float(), len(weights))
    total = torch.zeros((), dtype=torch.float32)
    correct, counted = [], []
    for k, h in enumerate(states, start=1):
        rows = torch.arange(max(first - k, 0), h.shape[0])  # label index i + k + 1 >= first + 1
        labels = scored_labels(ids, rows + k + 1, prompt_len, t2d_index, target_p[rows + k - first], score_prompt)
        valid = labels >= 0
        rows, labels = rows[valid], labels[valid]
        counted.append(int(rows.numel()))
        if not rows.numel():
            correct.append(0)
            continue
        logits = drafter.logits(drafter.module_for(k), h[rows])
        p = target_p[rows + k - first]
        total = total + weights[k - 1] * -(p * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        correct.append(int((logits.argmax(-1) == labels).sum()))
    return total, StepMetrics(float(total.detach()), correct, counted)
