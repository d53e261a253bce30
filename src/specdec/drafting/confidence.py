"""Stopping a chain draft early when the drafter is unsure of the token it just drafted.

A chain's later tokens are accepted only if every earlier one was, so a token the drafter itself rates
unlikely is rarely worth the drafter steps after it. After each drafted token the chain stops when the
drafter's probability of that token is below `confidence_threshold` (Hugging Face transformers calls this
`assistant_confidence_threshold`); the unsure token itself is still verified, which costs one row of the
target's forward and no drafter step. 0 (the default) always drafts num_speculative_tokens. Lossless
either way: verification does not depend on how the draft's length was chosen.
"""

from __future__ import annotations

import torch


def threshold_problems(threshold: float) -> list[str]:
    if not 0.0 <= threshold < 1.0:
        return [f"confidence_threshold must be in [0, 1), got {threshold}"]
    return []


def keeps_drafting(threshold: float, logits: torch.Tensor, q: torch.Tensor | None, token: int) -> bool:
    """Whether to draft past `token`. `logits` [V] are the drafter's (greedy: the token is their argmax);
    `q` is the distribution `token` (a target id) was sampled from, None when greedy."""
    if threshold <= 0.0:
        return True
    if q is not None:
        return float(q[token]) >= threshold
    return float(torch.softmax(logits.float(), dim=-1).max()) >= threshold
