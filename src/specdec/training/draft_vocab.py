"""The reduced draft vocabulary: the target tokens most frequent in the training responses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch


def frequent_tokens(responses: Iterable[Sequence[int]], size: int, vocab_size: int,
                    fallback: Iterable[Sequence[int]] = ()) -> torch.Tensor:
    """`size` target ids, ascending: by frequency in `responses`, then in `fallback` (e.g. prompts), then
    the lowest ids not yet taken, so that any size up to the vocabulary works on small data."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocab size must be in 1..{vocab_size}, got {size}")
    chosen: list[int] = []
    taken: set[int] = set()
    for source in (responses, fallback):
        counts: Counter[int] = Counter()
        for seq in source:
            counts.update(int(t) for t in seq)
        for token, _ in counts.most_common():
            if len(chosen) == size:
                break
            if token not in taken and 0 <= token < vocab_size:
                chosen.append(token)
                taken.add(token)
    token = 0
    while len(chosen) < size:
        if token not in taken:
            chosen.append(token)
            taken.add(token)
        token += 1
    return torch.tensor(sorted(chosen), dtype=torch.long)


def coverage(responses: Iterable[Sequence[int]], ids: torch.Tensor) -> float:
    """Fraction of response tokens that are in the draft vocabulary."""
    members = set(ids.tolist())
    total = hit = 0
    for seq in responses:
        total += len(seq)
        hit += sum(1 for t in seq if int(t) in members)
    return hit / max(total, 1)
