"""Training over the draft vocabulary plus the sample's own tokens, as `context_vocab` drafts at inference.

At inference (drafting/context_vocab.py) every token of the request seen so far joins the draft vocabulary
through the target's LM head rows. Training over the static vocabulary alone never scores a position whose
token is outside it, and those are mostly tokens copied from the prompt (names, rare words, word pieces):
the drafter never learns to copy them, and a summary, which copies most of its words from the article,
drafts poorly. Here a sample's tokens outside the static vocabulary get extra columns, each one allowed
from the position where the token first appears, as at inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

BLOCKED = -1e9  # logit of a column not yet allowed


@dataclass
class ContextColumns:
    """Extra columns after the static draft vocabulary's `static_size`, for one sample."""

    static_size: int
    ids: torch.Tensor  # [E] target ids, ascending
    first: torch.Tensor  # [E] position of each one's first occurrence in the sample
    rows: torch.Tensor  # [E, H] the target's LM head rows of these ids, float32

    def allowed(self, context_end: torch.Tensor) -> torch.Tensor:
        """[n, E] whether each extra column is proposable after a context that ends at `context_end` [n]
        (inclusive): the token has already appeared there."""
        return self.first[None, :] <= context_end[:, None]

    def labels(self, tokens: torch.Tensor, static_labels: torch.Tensor, context_end: torch.Tensor) -> torch.Tensor:
        """Static labels [n], with tokens outside the static vocabulary mapped to their extra column when
        that column is allowed (else they stay -1, unscored)."""
        if not self.ids.numel():
            return static_labels
        col = torch.searchsorted(self.ids, tokens).clamp_(max=self.ids.numel() - 1)
        hit = (self.ids[col] == tokens) & (self.first[col] <= context_end)
        return torch.where((static_labels < 0) & hit, self.static_size + col, static_labels)

    def extend(self, static_logits: torch.Tensor, normed: torch.Tensor, context_end: torch.Tensor,
               softcap: float | None = None) -> torch.Tensor:
        """Static logits [n, Vd] of final-normed states `normed` [n, H], with the extra columns appended
        (a large negative value where not allowed: finite, so a zero target probability times its log
        probability stays zero in the cross-entropy). `softcap`: the target's final logit soft-cap, which
        the static logits already carry."""
        extra = torch.nn.functional.linear(normed.to(self.rows.dtype), self.rows).float()
        if softcap:
            extra = torch.tanh(extra / softcap) * softcap
        extra = extra.masked_fill(~self.allowed(context_end), BLOCKED)
        return torch.cat([static_logits, extra], dim=-1)


def context_columns(ids: torch.Tensor, t2d_index: torch.Tensor, head_weight: torch.Tensor) -> ContextColumns:
    """The extra columns of sample `ids` [T]: its distinct tokens outside the static vocabulary."""
    outside = t2d_index[ids] < 0
    positions = torch.arange(ids.numel(), device=ids.device)[outside]
    tokens = ids[outside]
    unique, inverse = torch.unique(tokens, sorted=True, return_inverse=True)
    first = torch.full((unique.numel(),), ids.numel(), dtype=torch.long, device=ids.device)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")
    rows = head_weight.detach()[unique.to(head_weight.device)].float()  # float32, as the training heads
    return ContextColumns(int((t2d_index >= 0).sum()), unique, first, rows)


def context_coverage(samples_ids: list[tuple[list[int], list[int]]], t2d_index: list[int]) -> float | None:
    """Share of response tokens a drafter with context columns can score: in the static vocabulary, or
    already seen in the prompt or earlier in the response. `samples_ids`: (prompt, response) pairs."""
    hits = total = 0
    for prompt, response in samples_ids:
        seen = set(prompt)
        for t in response:
            hits += t2d_index[t] >= 0 or t in seen
            total += 1
            seen.add(t)
    return hits / total if total else None


def context_response_coverage(objective: Any, samples: Sequence[Any]) -> float | None:
    """An objective's `response_coverage` (trainer.validate): None unless its options have context_vocab."""
    if not objective.options.context_vocab:
        return None
    return context_coverage([(s.prompt_ids, s.response_ids) for s in samples], objective.t2d_index.tolist())
