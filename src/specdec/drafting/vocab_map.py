"""The reduced draft vocabulary of a learned drafter, stored as speculators' `d2t` / `t2d` buffers.

Draft id d stands for target id d + d2t[d]; t2d[t] says whether target id t is in the draft vocabulary.
The drafter's LM head is the target's, restricted to those rows, so it is never saved with the drafter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.fast_linear import linear_float


class DraftVocab(nn.Module):
    """Mixin for drafter modules: call `_init_draft_vocab(vocab, draft_vocab)` in __init__."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    def _init_draft_vocab(self, vocab_size: int, draft_vocab_size: int) -> None:
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(vocab_size, dtype=torch.bool) if vocab_size == draft_vocab_size
                             else torch.zeros(vocab_size, dtype=torch.bool))

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """`target_ids` [draft_vocab] ascending: the target tokens the drafter can propose."""
        ids = torch.as_tensor(target_ids, dtype=torch.long, device=self.d2t.device)
        if ids.numel() != self.d2t.numel():
            raise ValueError(f"{ids.numel()} draft tokens for draft_vocab_size {self.d2t.numel()}")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_ids(self) -> torch.Tensor:
        """[draft_vocab] the target id of every draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def target_to_draft(self) -> torch.Tensor:
        """[vocab] draft index of each target id, -1 outside the draft vocab."""
        index = torch.full((self.t2d.numel(),), -1, dtype=torch.long, device=self.d2t.device)
        index[self.draft_ids()] = torch.arange(self.d2t.numel(), device=self.d2t.device)
        return index

    def head_rows(self, head_weight: torch.Tensor) -> torch.Tensor:
        """The target's LM head rows of the draft vocabulary (a frozen copy, never trained or saved)."""
        return head_weight.detach()[self.draft_ids().to(head_weight.device)].contiguous()


def head_logits(x: torch.Tensor, rows: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """float32 logits over the draft vocab from final-normed states x [..., H] (the target's LM head rows),
    with the target's final logit soft-cap when it has one."""
    x = x.to(rows.dtype)
    if not torch.is_grad_enabled() and x.dim() == 2:
        logits = linear_float(x, rows)  # inference: our row kernel streams the head fastest
    else:
        logits = F.linear(x, rows).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits
