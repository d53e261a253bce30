"""Greedy chain verification that scores the vocabulary in slices and drops rows that can no longer matter.

Verifying K draft tokens needs the target's argmax at K + 1 rows, and on a CPU the LM head over a large
vocabulary (Gemma: 262k x 640) is much of a forward: one row is bound by reading the head's weights, every
further row adds compute. But only the rows up to the first rejection are ever used. Scoring the
vocabulary slice by slice, a row is known to be rejected as soon as some token beats the draft token's own
logit; the rows after it are then dropped from the remaining slices. Rows that are kept (the accepted ones,
and the first rejected one, whose argmax is the next token) still see every slice.

The result is exactly `verify_greedy` on the full logits: every logit is the same number (the runtime
scores a slice with the same per-element arithmetic as the whole head), the argmax keeps the first index
among equal maxima, as torch's does, and a row is rejected only when its argmax cannot be the draft token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.verification.result import Verification

# Slice boundaries as fractions of the vocabulary: small first slices find most rejections (a wrong draft
# token is usually beaten by many tokens), the big last ones stream the rest with fewer calls.
SLICE_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)

# (final-normed rows [n, H], vocabulary columns: a slice or ids [c]) -> float32 logits [n, c]
HeadLogits = Callable[[torch.Tensor, "slice | torch.Tensor"], torch.Tensor]


def slice_bounds(vocab_size: int) -> list[int]:
    bounds = sorted({0, vocab_size, *(int(vocab_size * f) for f in SLICE_FRACTIONS)})
    return [b for b in bounds if 0 <= b <= vocab_size]


def verify_greedy_early_exit(draft: Sequence[int], hidden: torch.Tensor, head_logits: HeadLogits,
                             vocab_size: int) -> Verification:
    """`hidden` [k + 1, H]: the final-normed states of the verified rows (row i scores the token after draft
    token i - 1); `head_logits` scores any rows over any vocabulary columns."""
    k = len(draft)
    if hidden.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} rows of hidden states for {k} draft tokens")
    if k == 0:  # plain decoding: one row, one call over the whole head
        return Verification(num_accepted=0, next_token=int(head_logits(hidden, slice(0, vocab_size))[0].argmax()))
    device = hidden.device
    drafted = torch.as_tensor(list(draft), dtype=torch.long, device=device)
    # each draft token's own logit at its row: the bar every other token of that row must not beat
    own = head_logits(hidden[:k], drafted).diagonal()
    best_value = torch.full((k + 1,), float("-inf"), device=device)
    best_index = torch.zeros(k + 1, dtype=torch.long, device=device)
    live = k + 1  # rows 0..live-1 still matter
    bounds = slice_bounds(vocab_size)
    for start, stop in zip(bounds, bounds[1:]):
        logits = head_logits(hidden[:live], slice(start, stop))
        index = logits.argmax(dim=-1)
        value = logits.gather(1, index[:, None])[:, 0]
        better = value > best_value[:live]  # strictly: an earlier slice keeps a tie, as argmax does
        best_value[:live] = torch.where(better, value, best_value[:live])
        best_index[:live] = torch.where(better, index + start, best_index[:live])
        n = min(live, k)
        rejected = (best_value[:n] > own[:n]) | ((best_value[:n] == own[:n]) & (best_index[:n] < drafted[:n]))
        if bool(rejected.any()):
            live = int(rejected.nonzero()[0, 0]) + 1  # the first rejected row is the last one that matters
    accepted = 0
    while accepted < k and int(best_index[accepted]) == draft[accepted]:
        accepted += 1
    return Verification(num_accepted=accepted, next_token=int(best_index[accepted]))
