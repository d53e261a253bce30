"""Tree verification: the target walks a draft tree from the root and keeps one root-to-node path.

A tree draft is `tokens` in topological order with `parents[i]` the index of node i's parent, or -1 for a
child of the root (the pending last token, not part of the draft). Target rows: row 0 scores the token
after the root, row i + 1 the token after node i (one forward over [root, *tokens] with tree attention).
With a chain (parents = -1, 0, 1, ...) both functions return what verify_greedy / verify_sampling return,
consuming the generator identically.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.models.greedy_argmax import greedy_argmax
from specdec.verification.probabilities import sample
from specdec.verification.result import Verification


def tree_children(parents: Sequence[int]) -> list[list[int]]:
    """children[r] = the nodes whose parent is row r's node (row 0 = root, row i + 1 = node i), in draft order."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parent {p} of draft node {i} must be -1 (the root) or an earlier node")
        children[p + 1].append(i)
    return children


def _check(tokens: Sequence[int], parents: Sequence[int], rows: int, what: str) -> None:
    if len(parents) != len(tokens):
        raise ValueError(f"{len(parents)} parents for {len(tokens)} draft tokens")
    if rows != len(tokens) + 1:
        raise ValueError(f"need {len(tokens) + 1} rows of {what} for {len(tokens)} draft tokens, got {rows}")


def _first_of_each_token(nodes: list[int], tokens: Sequence[int]) -> list[int]:
    """Siblings repeating a token are the same candidate; only the first (and its subtree) is ever kept."""
    seen: set[int] = set()
    out = []
    for n in nodes:
        if tokens[n] not in seen:
            seen.add(tokens[n])
            out.append(n)
    return out


def verify_tree_greedy(tokens: Sequence[int], parents: Sequence[int], target_logits: torch.Tensor | None,
                       target_argmax: torch.Tensor | None = None) -> Verification:
    """Temperature 0: from the root, descend into the (first) child equal to the target's argmax; the next
    token is the argmax at the last node kept. `target_argmax` (the greedy token of each row, when the forward
    computed it) is enough without the logits."""
    if target_argmax is None:
        if target_logits is None:
            raise ValueError("greedy verification needs the target's logits or their argmax")
        target_argmax = greedy_argmax(target_logits)
    _check(tokens, parents, target_argmax.shape[0], "target logits")
    children = tree_children(parents)
    target = target_argmax.tolist()
    path: list[int] = []
    row = 0
    while True:
        match = next((c for c in children[row] if tokens[c] == target[row]), None)
        if match is None:
            return Verification(num_accepted=len(path), next_token=target[row], path=tuple(path))
        path.append(match)
        row = match + 1


def verify_tree_sampling(
    tokens: Sequence[int],
    parents: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verification:
    """Multi-candidate speculative sampling down a tree; the output is distributed exactly as sampling from
    the target alone (algorithms.md 0.3).

    At each kept node its children are tried in order against the current distribution p (the target's row
    there): child x is accepted with probability min(1, p(x)/q(x)) and then descended into; a rejection
    replaces p by the residual, norm((p - q)+), and the next child is tried; when none is accepted the next
    token is drawn from p (also the bonus draw at a leaf).

    draft_probs None: every node is a point mass (deterministic top-k children), q(x) = 1, the residual is p
    with x removed (sampling without replacement, EAGLE's `evaluate_posterior`); siblings repeating a token
    are tried once. Otherwise [k, V]: row i is the distribution node i was drawn from, independently of the
    other drafted tokens given its parent (e.g. i.i.d. siblings from the parent's distribution, SpecInfer).
    target_probs: [k + 1, V], warped exactly like draft_probs.
    """
    k = len(tokens)
    _check(tokens, parents, target_probs.shape[0], "target probabilities")
    if draft_probs is not None and draft_probs.shape[0] != k:
        raise ValueError(f"need {k} rows of draft probabilities for {k} draft tokens, got {draft_probs.shape[0]}")
    children = tree_children(parents)
    # One uniform per node (each node is tried at most once), drawn up front so a seed fixes the whole step.
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64).tolist() if k else []
    path: list[int] = []
    row = 0
    while True:
        p = target_probs[row]
        candidates = children[row] if draft_probs is not None else _first_of_each_token(children[row], tokens)
        accepted = None
        for node in candidates:
            x = tokens[node]
            q = 1.0 if draft_probs is None else float(draft_probs[node, x])
            if q > 0 and uniforms[node] * q < float(p[x]):  # u < p/q, written without the division
                accepted = node
                break
            if draft_probs is None:
                residual = p.clone()
                residual[x] = 0.0
            else:
                residual = (p - draft_probs[node].to(p.dtype)).clamp_(min=0.0)
            total = float(residual.sum())
            if total > 0.0:  # else p <= q everywhere, i.e. p == q: this rejection had probability 0
                p = residual / total
        if accepted is None:
            return Verification(num_accepted=len(path), next_token=sample(p, generator), path=tuple(path))
        path.append(accepted)
        row = accepted + 1
