"""Attention masks over the whole KV buffer for a forward of T new tokens (a chain or a draft tree)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def tree_ancestry(parents: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For tokens in topological order with parent indices (-1 = child of the committed prefix), returns
    ([T, T] bool, True where column j is row i or one of its ancestors) and ([T] depth, 0 for roots)."""
    t = len(parents)
    ancestry = torch.eye(t, dtype=torch.bool)
    depth = [0] * t
    for i, p in enumerate(parents):
        if p >= i or p < -1:
            raise ValueError(f"parent {p} of node {i} must be -1 or an earlier node")
        if p >= 0:
            ancestry[i] |= ancestry[p]
            depth[i] = depth[p] + 1
    return ancestry.to(device), torch.tensor(depth, dtype=torch.long, device=device)


def chain_parents(num_tokens: int) -> list[int]:
    return list(range(-1, num_tokens - 1))


def build_mask(
    slot_positions: torch.Tensor,
    committed: int,
    ancestry: torch.Tensor,
    query_positions: torch.Tensor,
    window: int | None,
) -> torch.Tensor:
    """[T, capacity] bool mask, True where a query may attend a slot.

    Committed slots are visible to every query (they precede it); pending slot `committed + j` is visible to
    query i iff j is i or an ancestor of i; a sliding window additionally hides slots too far behind.
    """
    t = ancestry.shape[0]
    capacity = slot_positions.shape[0]
    mask = torch.zeros(t, capacity, dtype=torch.bool, device=slot_positions.device)
    mask[:, :committed] = True
    mask[:, committed : committed + t] = ancestry
    if window is not None:
        mask &= (query_positions[:, None] - slot_positions[None, :]) < window
    return mask


def tree_slot_order(ancestry: torch.Tensor, committed: int, capacity: int) -> torch.Tensor:
    """[T, capacity] long: for token i, the slot its column s reads. Committed slots read themselves;
    column committed + k reads the slot of i's ancestor at depth k (i itself at its own depth), which is
    where a chain, and plain decoding, keep that token; later pending columns read themselves (masked)."""
    t, host = ancestry.shape[0], ancestry.cpu()  # built on the host: no device sync per row
    order = torch.arange(capacity).repeat(t, 1)
    for i in range(t):
        path = host[i].nonzero().flatten()  # ancestors and i, in slot order = depth order
        order[i, committed : committed + path.numel()] = committed + path
    return order.to(ancestry.device)


def reorder_mask(mask: torch.Tensor, order: torch.Tensor, depth: torch.Tensor, committed: int) -> torch.Tensor:
    """The bool mask [T, capacity] in each token's slot order: column s of token i is visible iff slot
    order[i, s] is, and no pending column past i's depth is."""
    out = mask.gather(1, order)
    cols = torch.arange(mask.shape[1], device=mask.device)
    return out & ((cols[None, :] < committed) | (cols[None, :] <= committed + depth[:, None]))


# Attention spans of the AVX2 attention kernel (kernels/avx2_attention_batch.cpp, attention_span there): a
# query row reads only the columns [first, end) of its cache, whole groups of SPAN_STEP slots.
SPAN_STEP = 16


def attention_span(reach: int, capacity: int, window: int | None) -> tuple[int, int]:
    """The columns [first, end) a query row reads in the AVX2 attention kernel: the columns it may see (up to
    `reach`, its position, and back to its sliding window's start) widened to whole 16-slot groups, within the
    cache's capacity. The kernels' softmax sums each column into the lane of its slot, so the row's bits are
    the same over any span that holds what it sees; the kernel's C++ twin."""
    end = min(capacity, -(-(reach + 1) // SPAN_STEP) * SPAN_STEP)
    if window is None:
        return 0, end
    return max(0, reach - window + 1) // SPAN_STEP * SPAN_STEP, end
