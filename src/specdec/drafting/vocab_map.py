"""The reduced draft vocabulary of a learned drafter, stored as speculators' `d2t` / `t2d` buffers.

Draft id d stands for target id d + d2t[d]; t2d[t] says whether target id t is in the draft vocabulary.
The drafter's LM head is the target's, restricted to those rows, so it is never saved with the drafter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models import fast_linear
from specdec.models.fast_linear import linear_float

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel


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

    def head_rows(self, head_weight: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The target's LM head rows of the draft vocabulary (a frozen copy, never trained or saved), in
        `dtype` when given (training passes float32: CPU bf16 matmuls with an 8k inner dimension run at a
        fraction of a GFLOP/s backward)."""
        rows = head_weight.detach()[self.draft_ids().to(head_weight.device)].contiguous()
        return rows if dtype is None else rows.to(dtype)


class SharedTargetParts(DraftVocab):
    """Mixin for drafters that embed tokens with the target's embedding and predict through its LM head
    rows of the draft vocabulary (EAGLE-3, DFlash). Needs `self.norm` (the drafter's final norm)."""

    _embed: torch.Tensor | None = None
    _embed_scale: float = 1.0
    _head: torch.Tensor | None = None
    norm: nn.Module

    def attach_target(self, embed_weight: torch.Tensor, head_weight: torch.Tensor, embed_scale: float,
                      head_dtype: torch.dtype | None = None) -> None:
        """Frozen views of the target's embedding (scaled as the target scales its input) and LM head rows of
        the draft vocab, never trained nor saved; `head_dtype` as in `head_rows`."""
        self._embed = embed_weight.detach()
        self._embed_scale = embed_scale
        self._head = self.head_rows(head_weight, head_dtype)

    def ready_for(self, target: LoadedModel) -> Self:
        """For inference beside `target`: on its device and dtype, in eval mode, its embedding and head attached."""
        decoder = target.decoder
        assert decoder is not None
        self.to(device=target.device, dtype=target.dtype).eval()  # type: ignore[attr-defined]
        self.attach_target(decoder.embed.weight, decoder.head_weight(), decoder.arch.embed_scale or 1.0)
        # the linears and head rows in the AMX kernels' layout, as the target's: the same bits, and a drafter
        # step over a few dozen rows is bound by reading its weights (at 32 sequences its dense linears
        # took a third of drafting)
        for module in self.modules():  # type: ignore[attr-defined]
            if isinstance(module, nn.Linear):
                fast_linear.pack_weight(module.weight)
        if self._head is not None:
            fast_linear.pack_weight(self._head)
        return self

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if self._embed is None:
            raise RuntimeError("attach_target() first: the drafter uses the target's embedding")
        return self._embed[tokens] * self._embed_scale  # plain indexing: F.embedding is slow on this big table

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + the target's LM head restricted to the draft vocab, in float32."""
        assert self._head is not None
        x = self.norm(h).to(self._head.dtype)
        if not torch.is_grad_enabled() and x.dim() == 2:
            return linear_float(x, self._head)  # inference: our row kernel streams the head fastest
        return F.linear(x, self._head).float()

    def draft_logits_from_normed(self, normed: torch.Tensor) -> torch.Tensor:
        """The target's own logits over the draft vocab from its final-normed hidden states (training targets)."""
        assert self._head is not None
        return F.linear(normed.to(self._head.dtype), self._head).float()


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
