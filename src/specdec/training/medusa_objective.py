"""Medusa's training objective (Medusa-1: the target frozen, only the heads learn).

Head k at position i predicts token i + 2 + k. With greedy self-distilled data every response token is the
target's argmax, so the soft target of head k at i is the target's own distribution at position i + 1 + k
(over the draft vocabulary), scored where token i + 2 + k is a response token in the draft vocabulary;
head k is weighted decay**k (the paper's 0.8**k). Prompt positions are scored only with `score_prompt`
(labels: see training/labels.py). With a `context_head`, the sample's tokens seen before the draft's start
join the draft vocabulary, as at inference (context_columns.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.drafting.medusa_model import TOP_K, MedusaHeads
from specdec.drafting.vocab_map import head_logits
from specdec.training.context_columns import context_columns
from specdec.training.labels import targets_and_labels
from specdec.training.trainer import StepMetrics


@dataclass
class MedusaMetrics(StepMetrics):
    ranks: torch.Tensor  # [heads, TOP_K + 1] counts of the label's rank in each head (last column: >= TOP_K)


def medusa_loss(heads: MedusaHeads, ids: torch.Tensor, prompt_len: int, final_hidden: torch.Tensor, decay: float,
                t2d_index: torch.Tensor, score_prompt: bool = False,
                context_head: torch.Tensor | None = None,
                hits: list[tuple[int, torch.Tensor, torch.Tensor]] | None = None) -> tuple[torch.Tensor, MedusaMetrics]:
    """Loss of one sequence `ids` [T] whose tokens from `prompt_len` on the target wrote greedily.
    `context_head` (the target's whole LM head) adds context columns: head k at position i drafts after
    the committed context ids[: i + 2]. `hits`, when given, receives (draft step k, the position before each
    scored label, whether it was right), as eagle3_objective.ttt_loss does."""
    c = heads.config
    T = ids.shape[0]
    first = 0 if score_prompt else max(prompt_len - 1, 0)  # positions whose next token is scored
    assert heads._head is not None
    extra = context_columns(ids, t2d_index, context_head) if context_head is not None else None
    with torch.no_grad():
        target_logits = head_logits(final_hidden[first : T - 1], heads._head, c.logit_softcap)
    h = final_hidden.float()
    total = torch.zeros((), dtype=torch.float32)
    correct, counted = [], []
    ranks = torch.zeros(c.num_heads, TOP_K + 1, dtype=torch.long)
    chain = []  # (head, position before the drafted token, right): hits, and validation's greedy walk
    for k in range(c.num_heads):
        rows = torch.arange(max(first - 1 - k, 0), max(T - 2 - k, 0))  # label index i + 2 + k <= T - 1
        p, labels = targets_and_labels(target_logits[rows + 1 + k - first], final_hidden[rows + 1 + k], ids,
                                       rows + 2 + k, rows + 1, prompt_len, t2d_index, extra, c.logit_softcap,
                                       score_prompt)
        valid = labels >= 0
        rows, labels, p = rows[valid], labels[valid], p[valid]
        counted.append(int(rows.numel()))
        if not rows.numel():
            correct.append(0)
            continue
        states = heads.head_state(k, h[rows])
        logits = heads.logits(states, k)
        if extra is not None:
            logits = extra.extend(logits, states, rows + 1, c.logit_softcap)
        total = total + (decay**k) * -(p * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        with torch.no_grad():
            rank = (logits > logits.gather(1, labels[:, None])).sum(-1).clamp_(max=TOP_K)
            ranks[k] += torch.bincount(rank, minlength=TOP_K + 1).cpu()
        correct.append(int((rank == 0).sum()))
        chain.append((k, rows + 1 + k, rank == 0))
    if hits is not None:
        hits.extend(chain)
    return total, MedusaMetrics(float(total.detach()), correct, counted, ranks, chain_hits=chain)
