"""The reduced draft vocabulary: the target tokens most frequent in the training responses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch


def frequent_tokens(responses: Iterable[Sequence[int]], size: int, vocab_size: int,
                    fallback: Iterable[Sequence[int]] = (), within: torch.Tensor | None = None) -> torch.Tensor:
    """`size` target ids, ascending: by frequency in `responses`, then in `fallback` (e.g. prompts), then
    the lowest ids not yet taken, so that any size up to the vocabulary works on small data.

    `within` (target ids) limits the choice to those tokens: it shrinks a trained drafter's vocabulary to
    its most frequent part (as FR-Spec does), which keeps its weights valid since the LM head rows are the
    target's."""
    allowed = range(vocab_size) if within is None else sorted(set(int(t) for t in within.tolist()))
    if not 1 <= size <= len(allowed):
        raise ValueError(f"draft vocab size must be in 1..{len(allowed)}, got {size}")
    members = None if within is None else set(allowed)
    chosen: list[int] = []
    taken: set[int] = set()
    for source in (responses, fallback):
        counts: Counter[int] = Counter()
        for seq in source:
            counts.update(int(t) for t in seq)
        for token, _ in counts.most_common():
            if len(chosen) == size:
                break
            if token not in taken and 0 <= token < vocab_size and (members is None or token in members):
                chosen.append(token)
                taken.add(token)
    for token in allowed:
        if len(chosen) == size:
            break
        if token not in taken:
            chosen.append(token)
            taken.add(token)
    return torch.tensor(sorted(chosen), dtype=torch.long)


def coverage(responses: Iterable[Sequence[int]], ids: torch.Tensor) -> float:
    """Fraction of response tokens that are in the draft vocabulary."""
    members = set(ids.tolist())
    total = hit = 0
    for seq in responses:
        total += len(seq)
        hit += sum(1 for t in seq if int(t) in members)
    return hit / max(total, 1)
