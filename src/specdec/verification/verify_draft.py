"""The one verification entry point: a draft tree (a chain is the tree with parents -1, 0, 1, ...) against
the target's rows, choosing greedy, greedy early-exit or speculative sampling (as vLLM's one rejection
sampler does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.sampling_params import SamplingParams
from specdec.verification.greedy_early_exit import HeadLogits, HeadMax, verify_greedy_early_exit
from specdec.verification.probabilities import sampling_probs
from specdec.verification.result import Verification
from specdec.verification.tree import verify_tree_greedy, verify_tree_sampling


@dataclass
class TargetRows:
    """What the target's forward over [root, *draft] left for verification: logits [n + 1, V], or (greedy
    only) the final-normed rows [n + 1, H] with a head that scores any vocabulary slice exactly."""

    logits: torch.Tensor | None = None
    final_hidden: torch.Tensor | None = None
    head_logits: HeadLogits | None = None
    head_max: HeadMax | None = None  # each row's best logit over a slice, without the logits (None: from them)
    vocab_size: int = 0
    argmax: torch.Tensor | None = None  # greedy_argmax(logits) when the forward computed it (enough for greedy)


def chain_parents(n: int) -> list[int]:
    return list(range(-1, n - 1))


def verify(
    tokens: Sequence[int],
    parents: Sequence[int] | None,
    draft_probs: torch.Tensor | None,
    target: TargetRows,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Verification:
    """Verifies a draft (`parents` None: a chain) after the root; lossless for every choice it makes."""
    parents = chain_parents(len(tokens)) if parents is None else parents
    if params.greedy and target.logits is None and target.argmax is None:
        if target.final_hidden is None or target.head_logits is None:
            raise ValueError("greedy early exit needs the final hidden rows and a slice-exact head")
        return verify_greedy_early_exit(tokens, target.final_hidden, target.head_logits, target.vocab_size,
                                        parents=parents, head_max=target.head_max)
    if params.greedy:
        return verify_tree_greedy(tokens, parents, target.logits, target.argmax)
    if target.logits is None:
        raise ValueError("sampling verification needs the target's logits")
    probs = sampling_probs(target.logits, params.temperature, params.top_k, params.top_p)
    return verify_tree_sampling(tokens, parents, draft_probs, probs, generator)
