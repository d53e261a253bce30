"""DFlash drafts of many sequences at once: one drafter block forward serves every sequence.

The same steps as `DFlashProposer.propose` (dflash.py), sequence by sequence in the bookkeeping and batched
in the arithmetic: the context projection of every sequence's pending positions in one call, every block
through the drafter's linears in one call per layer (row-invariant in bfloat16 on CPU), attention per
sequence over its own context cache (the shapes it has alone), and the draft vocabulary's static logits of
every slot in one call. So every draft, and every cache after it, is the one `propose` gives alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from specdec.drafting.base import Draft
from specdec.models.fast_linear import linear_float

if TYPE_CHECKING:
    from specdec.drafting.dflash import DFlashProposer


@torch.inference_mode()
def add_pending(ps: Sequence[DFlashProposer]) -> None:
    """`p._add_pending()` for every p (sharing one drafter): all pending positions in one context call."""
    waiting = [p for p in ps if p.pending is not None]
    if not waiting:
        return
    d, dev = waiting[0].drafter, waiting[0].target.device
    sizes = [p.pending.shape[0] for p in waiting]  # type: ignore[union-attr]
    positions = torch.cat([torch.arange(p.cache.length, p.cache.length + n, device=dev)  # type: ignore[union-attr]
                           for p, n in zip(waiting, sizes)])
    kvs = d.context_kv(d.context(torch.cat([p.pending for p in waiting])), positions)  # type: ignore[misc]
    start = 0
    for p, n in zip(waiting, sizes):
        p.cache.append([(k[:, start : start + n], v[:, start : start + n]) for k, v in kvs])  # type: ignore[union-attr]
        p.pending = None
        start += n


@torch.inference_mode()
def draft_blocks(ps: Sequence[DFlashProposer], tokens: Sequence[Sequence[int]],
                 max_tokens: Sequence[int]) -> list[Draft]:
    """`ps[i].propose(tokens[i], max_tokens[i])` for every i; the proposers share one drafter."""
    add_pending(ps)  # even for a sequence without room to draft, as propose does
    for p, t in zip(ps, tokens):
        p._check_step(t)
        p.vocab.follow(t)
    ks = [min(p.k, m) for p, m in zip(ps, max_tokens)]
    out = [Draft(tokens=[]) for _ in ps]
    active = [j for j, k in enumerate(ks) if k > 0]
    if not active:
        return out
    d, dev = ps[0].drafter, ps[0].target.device
    # each sequence's whole block [pending token, MASK...] at its positions len - 1 .., one block per sequence
    block = d.block_tokens(torch.tensor([tokens[j][-1] for j in active], device=dev))
    starts = torch.tensor([len(tokens[j]) - 1 for j in active], device=dev)
    positions = starts[:, None] + torch.arange(d.config.block_size, device=dev)[None]
    h = d.blocks_batch(block, positions, [ps[j].cache.views() for j in active])  # type: ignore[union-attr]
    normed = d.norm(torch.cat([h[r, 1 : 1 + ks[j]] for r, j in enumerate(active)]))
    # the static draft vocabulary is the shared drafter's; each request's context columns stay its own
    rows = ps[active[0]].vocab.static_rows
    static = linear_float(normed.to(rows.dtype), rows)
    start = 0
    for j in active:
        end = start + ks[j]
        out[j] = ps[j]._draft(ps[j].vocab.logits(normed[start:end], static_logits=static[start:end]))
        start = end
    return out
