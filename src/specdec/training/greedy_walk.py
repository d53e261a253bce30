"""The mean acceptance length a greedy chain would reach on held-out responses: tokens per decoding step.

Per-slot accuracies averaged over every position (1 + a1 + a1 a2 + ..., `estimated_acceptance_length`)
weigh easy and hard positions alike. Decoding does not: it crosses a stretch the drafter predicts well in a
few long steps and spends a step on nearly every token of a hard one, so the position average overstates
the bench's figure (for the DFlash drafter 3.64 against about 2, on the same held-out responses). The walk
follows the chain as decoding does: from the first response token, keep the run of drafts that match, step
past them and the target's own token, and count the steps.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def leading_runs(hit_rows: Iterable[tuple[int, torch.Tensor, torch.Tensor]]) -> dict[int, int]:
    """Per pending-token position, how many drafts of a greedy chain match the target's tokens: the leading
    run of right steps. `hit_rows`: (draft step j, from 0; the position before each scored drafted token,
    i.e. the pending token's position + j, as the objectives' `hits` give it; whether the draft was right).
    A position not scored at step j (a label outside the vocabulary, the sequence's end) ends its run
    there, as a draft that cannot be made ends the chain."""
    right: dict[int, dict[int, bool]] = {}
    for step, positions, hit in hit_rows:
        for p, h in zip(positions.tolist(), hit.tolist()):
            right.setdefault(p - step, {})[step] = bool(h)
    runs = {}
    for p, steps in right.items():
        n = 0
        while steps.get(n, False):
            n += 1
        runs[p] = n
    return runs


def greedy_walk(runs: dict[int, int], start: int, end: int) -> tuple[int, int]:
    """(tokens, steps) of greedy speculative decoding from the pending token at `start` (the first response
    token) while it sits before `end` (the last position whose next token is known): each step keeps
    runs[p] drafts plus the target's token after them. Stops where a position has no run."""
    tokens = steps = 0
    p = start
    while p < end and p in runs:
        n = runs[p]
        tokens += n + 1
        steps += 1
        p += n + 1
    return tokens, steps
