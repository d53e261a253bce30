"""A drafter's draft vocabulary, extended per request with the tokens of its context.

A reduced draft vocabulary (8k of Gemma's 262k tokens) cannot propose the rare tokens a response copies
from its prompt: names in a summary, words of a translation, identifiers in code. They are up to a fifth of
the response tokens on such prompts. Every learned drafter here (EAGLE-3, DFlash, Medusa, MTP) predicts
through the target's own LM head rows, so it can score any target token: this class adds the rows of every token seen in the
request (prompt and output so far) to the static draft vocabulary. Drafting stays lossless whatever the
drafter proposes; this only changes which tokens it can propose.

Local ids: 0..V_static-1 are the drafter's own draft ids; V_static.. are the context tokens outside it,
in the order they were first seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from specdec.models.fast_linear import linear_float

if TYPE_CHECKING:
    from specdec.quantization.quantized_weight import QuantizedWeight


class ContextVocab:
    def __init__(self, static_ids: torch.Tensor, static_rows: torch.Tensor, head_weight: torch.Tensor,
                 softcap: float | None = None, enabled: bool = True) -> None:
        """static_ids [Vs] target ids of the draft vocabulary, static_rows [Vs, H] their LM head rows,
        head_weight [V, H] the target's whole LM head (read, never copied whole), softcap the target's final
        logit soft-cap if it has one. Disabled, it is the static vocabulary only."""
        self.static_ids = static_ids
        self.static_rows = static_rows
        # what the static columns are scored with: the rows, or a drafter's int8 copy of them (int8_weights.py)
        self.static_weight: torch.Tensor | QuantizedWeight = static_rows
        self.head_weight = head_weight.detach()
        self.softcap = softcap
        self.enabled = enabled
        self._static_set = frozenset(static_ids.tolist())
        self.reset()

    def start(self, prompt: Sequence[int]) -> None:
        """A new request: the prompt's tokens join the static vocabulary."""
        self.reset()
        self.follow(prompt)

    def follow(self, tokens: Sequence[int]) -> None:
        """The request's tokens so far (a prefix of them was seen before): the new ones join."""
        if self.enabled:
            self.add(tokens[self.seen :])
        self.seen = len(tokens)

    def reset(self) -> None:
        """Back to the static vocabulary."""
        self.seen = 0  # tokens of the request already followed
        self._known: set[int] = set()  # context tokens added so far
        self._extra: list[int] = []
        self._all_ids = self.static_ids
        self._extra_rows = self.static_rows.new_zeros((0, self.static_rows.shape[1]))

    def __len__(self) -> int:
        return self.static_ids.numel() + len(self._extra)

    @property
    def num_context_tokens(self) -> int:
        return len(self._extra)

    def add(self, tokens: Iterable[int]) -> None:
        """Makes these target ids proposable (those already in the vocabulary are skipped)."""
        new = []
        for t in tokens:
            t = int(t)
            if t not in self._known and t not in self._static_set and 0 <= t < self.head_weight.shape[0]:
                self._known.add(t)
                new.append(t)
        if not new:
            return
        self._extra.extend(new)
        ids = torch.tensor(new, dtype=torch.long, device=self.static_ids.device)
        self._all_ids = torch.cat([self._all_ids, ids])
        rows = self.head_weight[ids.to(self.head_weight.device)].to(self.static_rows.dtype)
        self._extra_rows = torch.cat([self._extra_rows, rows]).contiguous()

    def logits(self, normed: torch.Tensor, static_logits: torch.Tensor | None = None) -> torch.Tensor:
        """float32 logits [n, len(self)] of final-normed drafter states [n, H]. `static_logits` [n, Vs]
        (float32, before any soft-cap): the static columns, for a drafter that scores them with its own rows
        (Medusa heads with their own projections); the context columns always use the target's rows."""
        x = normed.to(self.static_rows.dtype)
        logits = self.static_logits(x) if static_logits is None else static_logits
        if self._extra:
            logits = torch.cat([logits, linear_float(x, self._extra_rows)], dim=-1)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def static_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """float32 logits [n, Vs] of the static columns (before any soft-cap) for final-normed states [n, H]."""
        return linear_float(normed.to(self.static_rows.dtype), self.static_weight)

    def target_id(self, local_id: int) -> int:
        n = self.static_ids.numel()
        return int(self.static_ids[local_id]) if local_id < n else self._extra[local_id - n]

    def to_target(self, local_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of local ids (any shape)."""
        return self._all_ids[local_ids]


def greedy_tops(vocabs: Sequence[ContextVocab], normed: torch.Tensor, static_logits: torch.Tensor
                ) -> list[tuple[int, float]]:
    """Per row j of final-normed drafter states normed [n, H], drafted through vocabs[j] (vocabularies sharing
    their static rows; static_logits [n, Vs] their static columns, before any soft-cap): the local id of the
    row's highest logit in `vocabs[j].logits` (the lowest id on ties, as argmax picks) and that token's
    probability under their softmax. The static columns' maxima and log-sum-exps come from one op over all
    rows, each row's context columns from its own few: a greedy chain then never builds a row's whole logit
    vector or its softmax (at 32 sequences those per-row ops took about a tenth of drafting)."""
    softcap = vocabs[0].softcap if vocabs else None

    def capped(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / softcap) * softcap if softcap else x

    static = capped(static_logits)
    best, index = static.max(dim=-1)
    lse = torch.logsumexp(static, dim=-1)
    out = []
    for j, (v, top, local, total) in enumerate(zip(vocabs, best.tolist(), index.tolist(), lse.tolist())):
        if v._extra:
            extra = capped(linear_float(normed[j : j + 1].to(v.static_rows.dtype), v._extra_rows)[0])
            extra_top, extra_local = extra.max(dim=0)
            if float(extra_top) > top:  # ties: the static column, the lower id
                top, local = float(extra_top), v.static_ids.numel() + int(extra_local)
            other = float(torch.logsumexp(extra, dim=0))
            high = max(total, other)
            total = high + math.log(math.exp(total - high) + math.exp(other - high))
        out.append((local, math.exp(top - total)))
    return out
