"""MTP training objective: every depth at once (depth k reads depth k - 1's outputs over the whole
sequence, see mtp_model.unroll), each scored against the target's distribution.

Depth k at position i predicts token i + k + 1; with greedy self-distilled data its soft target is the
target's distribution at position i + k over the draft vocabulary, scored where token i + k + 1 is a
response token in the draft vocabulary (prompt tokens too with `score_prompt`, see training/labels.py).
Depth k is weighted beta**(k - 1), normalised (FastMTP /
speculators: [0.51, 0.31, 0.18] for three steps with beta 0.6). With a `context_head`, the sample's tokens
seen before the draft's start join the draft vocabulary, as at inference (context_columns.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from specdec.drafting.mtp_model import MTPDrafter, unroll
from specdec.drafting.vocab_map import head_logits
from specdec.training.context_columns import context_columns
from specdec.training.labels import targets_and_labels
from specdec.training.trainer import StepMetrics


def step_weights(steps: int, beta: float) -> list[float]:
    raw = [beta**k for k in range(steps)]
    return [w / sum(raw) for w in raw]


def mtp_loss(drafter: MTPDrafter, ids: torch.Tensor, prompt_len: int, final_hidden: torch.Tensor,
             weights: Sequence[float], t2d_index: torch.Tensor,
             score_prompt: bool = False, context_head: torch.Tensor | None = None,
             hits: list[tuple[int, torch.Tensor, torch.Tensor]] | None = None) -> tuple[torch.Tensor, StepMetrics]:
    """Loss of one sequence `ids` [T] whose tokens from `prompt_len` on the target wrote greedily.
    `context_head` (the target's whole LM head) adds context columns: depth k at position i drafts after
    the committed context ids[: i + 2]. `hits`, when given, receives (draft step k - 1, the position before
    each scored label, whether it was right), as eagle3_objective.ttt_loss does."""
    T = ids.shape[0]
    first = 0 if score_prompt else max(prompt_len - 1, 0)  # positions whose next token is scored
    assert drafter._target is not None
    softcap = drafter.target.arch.final_logit_softcap
    extra = context_columns(ids, t2d_index, context_head) if context_head is not None else None
    with torch.no_grad():
        target_logits = head_logits(final_hidden[first : T - 1], drafter._target[1], softcap)
    states = unroll(drafter, ids, final_hidden.float(), len(weights))
    total = torch.zeros((), dtype=torch.float32)
    correct, counted = [], []
    chain = []  # (step, position before the drafted token, right): hits, and validation's greedy walk
    for k, h in enumerate(states, start=1):
        rows = torch.arange(max(first - k, 0), h.shape[0])  # label index i + k + 1 >= first + 1
        p, labels = targets_and_labels(target_logits[rows + k - first], final_hidden[rows + k], ids, rows + k + 1,
                                       rows + 1, prompt_len, t2d_index, extra, softcap, score_prompt)
        valid = labels >= 0
        rows, labels, p = rows[valid], labels[valid], p[valid]
        counted.append(int(rows.numel()))
        if not rows.numel():
            correct.append(0)
            continue
        module = drafter.module_for(k)
        normed = module.norm(h[rows], module.shared_norm)
        logits = head_logits(normed, drafter._target[1], softcap)
        if extra is not None:
            logits = extra.extend(logits, normed, rows + 1, softcap)
        total = total + weights[k - 1] * -(p * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        right = logits.argmax(-1) == labels
        correct.append(int(right.sum()))
        chain.append((k - 1, rows + k, right))
    if hits is not None:
        hits.extend(chain)
    return total, StepMetrics(float(total.detach()), correct, counted, chain_hits=chain)
