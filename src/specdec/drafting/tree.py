"""Helpers for tree drafts (Draft.parents set): depths, and cutting a tree to a maximum depth and size."""

from __future__ import annotations

from collections.abc import Sequence

from specdec.drafting.base import Draft


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node, 1 for children of the root (so a node's depth is the length of its path)."""
    depths: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parent {p} of draft node {i} must be -1 (the root) or an earlier node")
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def prune_to_depth(draft: Draft, max_depth: int, max_nodes: int | None = None) -> tuple[Draft, list[int]]:
    """Drops the nodes deeper than `max_depth`, then all but the first `max_nodes` of the rest (None: no
    limit); returns the smaller draft (same topological order, parents remapped, probs rows kept) and the
    original index of each kept node. A deeper node's descendants are deeper still, and a parent comes before
    its children, so every kept node keeps its parent."""
    if draft.parents is None:
        raise ValueError("prune_to_depth needs a tree draft (parents set)")
    if len(draft.parents) != len(draft.tokens):
        raise ValueError(f"{len(draft.parents)} parents for {len(draft.tokens)} draft tokens")
    depths = tree_depths(draft.parents)
    kept = [i for i, d in enumerate(depths) if d <= max_depth]
    if max_nodes is not None:
        kept = kept[: max(max_nodes, 0)]
    if len(kept) == len(draft.tokens):
        return draft, kept
    new_index = {old: new for new, old in enumerate(kept)}
    parents = [-1 if draft.parents[i] < 0 else new_index[draft.parents[i]] for i in kept]
    probs = None if draft.probs is None else draft.probs[kept]
    return Draft(tokens=[draft.tokens[i] for i in kept], probs=probs, parents=parents), kept
