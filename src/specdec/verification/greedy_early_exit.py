"""Greedy verification (chains and trees) that scores the vocabulary in slices and drops rows that can no
longer matter.

Verifying a draft needs the target's argmax at every row, and on a CPU the LM head over a large vocabulary
(Gemma: 262k x 640) is much of a forward: one row is bound by reading the head's weights, every further
row adds compute. But only the rows on the kept path are ever used. Scoring the vocabulary slice by slice,
a draft node is known to be rejected as soon as some token beats the node's own logit at its parent's row;
the rows of that node and of its whole subtree are then dropped from the remaining slices (in a chain:
every row after the first rejection). Rows still alive at the end (the kept path among them) see every
slice.

The result is exactly `verify_tree_greedy` (and for a chain `verify_greedy`) on the full logits: every
logit is the same number (the runtime scores a slice with the same per-element arithmetic as the whole
head), the argmax keeps the first index among equal maxima, as torch's does, and a node is dropped only
when its parent's argmax cannot be its token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.models.greedy_argmax import greedy_argmax
from specdec.verification.result import Verification
from specdec.verification.tree import tree_children

# Slice boundaries as fractions of the vocabulary: small first slices find most rejections (a wrong draft
# token is usually beaten by many tokens), the big last ones stream the rest with fewer calls.
SLICE_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)

# (final-normed rows [n, H], vocabulary columns: a slice or ids [c]) -> float32 logits [n, c]
HeadLogits = Callable[[torch.Tensor, "slice | torch.Tensor"], torch.Tensor]
# (final-normed rows [n, H], a slice of the vocabulary) -> (values [n] float32, indices [n] int64 within the
# slice): each row's greedy_argmax over head_logits(rows, slice) and the logit there, found without writing
# the logits (a quantized head's kernel), or None where the runtime cannot
HeadMax = Callable[[torch.Tensor, slice], "tuple[torch.Tensor, torch.Tensor] | None"]


def _slice_max(head_logits: HeadLogits, head_max: HeadMax | None, hidden: torch.Tensor,
               columns: slice) -> tuple[torch.Tensor, torch.Tensor]:
    found = None if head_max is None else head_max(hidden, columns)
    if found is not None:
        return found
    logits = head_logits(hidden, columns)
    index = greedy_argmax(logits)
    return logits.gather(1, index[:, None])[:, 0], index


def slice_bounds(vocab_size: int) -> list[int]:
    bounds = sorted({0, vocab_size, *(int(vocab_size * f) for f in SLICE_FRACTIONS)})
    return [b for b in bounds if 0 <= b <= vocab_size]


def _candidates(tokens: Sequence[int], children: list[list[int]]) -> list[bool]:
    """Siblings repeating a token are one candidate: only the first (and its subtree) can ever be kept."""
    out = [False] * len(tokens)
    for nodes in children:
        seen: set[int] = set()
        for n in nodes:
            out[n] = tokens[n] not in seen
            seen.add(tokens[n])
    return out


def _settle(dead: list[bool], parents: Sequence[int], rejected: Sequence[bool]) -> bool:
    """Marks rejected nodes and every descendant of a dead node dead (parents come before children);
    returns whether anything changed."""
    changed = False
    for i, p in enumerate(parents):
        now = dead[i] or rejected[i] or (p >= 0 and dead[p])
        changed |= now != dead[i]
        dead[i] = now
    return changed


def verify_greedy_early_exit(draft: Sequence[int], hidden: torch.Tensor, head_logits: HeadLogits,
                             vocab_size: int, parents: Sequence[int] | None = None,
                             head_max: HeadMax | None = None) -> Verification:
    """`hidden` [n + 1, H]: the final-normed states of the verified rows (row 0 scores the token after the
    root, row i + 1 the token after draft node i); `parents` as in verification/tree.py (None: a chain);
    `head_logits` scores any rows over any vocabulary columns; `head_max` (None: from head_logits) gives each
    row's best over a slice."""
    n = len(draft)
    if hidden.shape[0] != n + 1:
        raise ValueError(f"need {n + 1} rows of hidden states for {n} draft tokens")
    if n == 0:  # plain decoding: one row, one call over the whole head
        best = _slice_max(head_logits, head_max, hidden, slice(0, vocab_size))
        return Verification(num_accepted=0, next_token=int(best[1][0]))
    parents = list(range(-1, n - 1)) if parents is None else list(parents)
    if len(parents) != n:
        raise ValueError(f"{len(parents)} parents for {n} draft tokens")
    children = tree_children(parents)
    candidate = _candidates(draft, children)
    device = hidden.device
    drafted = torch.as_tensor(list(draft), dtype=torch.long, device=device)
    parent_row = torch.as_tensor([p + 1 for p in parents], dtype=torch.long, device=device)
    # each node's own logit at its parent's row: the bar every other token of that row must not beat
    own = head_logits(hidden[parent_row], drafted).diagonal()
    best_value = torch.full((n + 1,), float("-inf"), device=device)
    best_index = torch.zeros(n + 1, dtype=torch.long, device=device)
    dead = [False] * n
    _settle(dead, parents, [not c for c in candidate])
    rows = torch.as_tensor([0, *(i + 1 for i in range(n) if not dead[i])], device=device)
    bounds = slice_bounds(vocab_size)
    for start, stop in zip(bounds, bounds[1:]):
        value, index = _slice_max(head_logits, head_max, hidden[rows], slice(start, stop))
        better = value > best_value[rows]  # strictly: an earlier slice keeps a tie, as argmax does
        best_value[rows] = torch.where(better, value, best_value[rows])
        best_index[rows] = torch.where(better, index + start, best_index[rows])
        bar, bar_index = best_value[parent_row], best_index[parent_row]
        rejected = ((bar > own) | ((bar == own) & (bar_index < drafted))).tolist()
        if _settle(dead, parents, rejected):
            rows = torch.as_tensor([0, *(i + 1 for i in range(n) if not dead[i])], device=device)
    target = best_index.tolist()  # exact at every row still alive, and the walk below visits only those
    path: list[int] = []
    row = 0
    while True:
        match = next((c for c in children[row] if candidate[c] and draft[c] == target[row]), None)
        if match is None:
            return Verification(num_accepted=len(path), next_token=target[row], path=tuple(path))
        path.append(match)
        row = match + 1
