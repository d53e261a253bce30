from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.verification.probabilities import sample
from specdec.verification.result import Verification


def verify_sampling(
    draft: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verification:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1); the output is distributed exactly as
    sampling from the target alone.

    draft_probs: [k, V] distributions the draft tokens were sampled from, or None when the draft tokens are
    point masses (n-gram, argmax): then q(x) = 1, so x is accepted with probability p(x) and a rejection
    resamples from p with x removed. target_probs: [k + 1, V], already warped exactly like draft_probs.
    """
    k = len(draft)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} rows of target probabilities for {k} draft tokens")
    if draft_probs is not None and draft_probs.shape[0] != k:
        raise ValueError(f"need {k} rows of draft probabilities for {k} draft tokens")
    # One uniform per draft position, drawn up front so a seed fixes the whole step.
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64).tolist() if k else []
    for i, token in enumerate(draft):
        p = float(target_probs[i, token])
        q = 1.0 if draft_probs is None else float(draft_probs[i, token])
        if q > 0 and uniforms[i] * q < p:  # u < p/q, written without the division
            continue
        if draft_probs is None:
            residual = target_probs[i].clone()
            residual[token] = 0.0
        else:
            residual = (target_probs[i] - draft_probs[i].to(target_probs.dtype)).clamp_(min=0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p <= q everywhere can only mean p == q; rejection then has probability 0
            residual, total = target_probs[i], 1.0
        return Verification(num_accepted=i, next_token=sample(residual / total, generator))
    return Verification(num_accepted=k, next_token=sample(target_probs[k], generator))
