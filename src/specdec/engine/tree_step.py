"""One verification step for a tree draft: forward the tree, verify, commit the kept path, tell the proposer."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafting.base import Draft, Proposer
from specdec.drafting.tree import prune_to_depth
from specdec.models.runtime import ForwardResult, ModelRuntime
from specdec.sampling_params import SamplingParams
from specdec.verification import Verification, sampling_probs, verify_tree_greedy, verify_tree_sampling
from specdec.verification.greedy_early_exit import verify_greedy_early_exit


def _verify_tree(
    draft: Draft, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Verification:
    assert draft.parents is not None
    if params.greedy:
        return verify_tree_greedy(draft.tokens, draft.parents, logits)
    target_probs = sampling_probs(logits, params.temperature, params.top_k, params.top_p)
    return verify_tree_sampling(draft.tokens, draft.parents, draft.probs, target_probs, generator)


def _rows_at(result: ForwardResult, kept: list[int], size: int) -> ForwardResult:
    """The forward of a cut tree laid out over the proposer's own draft indices: row kept[j] + 1 holds row
    j + 1, the cut nodes' rows are zeros (they are never on the kept path)."""
    index = torch.tensor([0, *(i + 1 for i in kept)])

    def spread(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros((size + 1, *x.shape[1:])).index_copy_(0, index.to(x.device), x)

    return ForwardResult(
        logits=None if result.logits is None else spread(result.logits),
        hidden={layer: spread(h) for layer, h in result.hidden.items()},
        final_hidden=None if result.final_hidden is None else spread(result.final_hidden),
    )


def tree_step(
    runtime: ModelRuntime,
    proposer: Proposer,
    draft: Draft,
    token: int,
    room: int,
    max_nodes: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    capture: Sequence[int],
) -> tuple[int, list[int]]:
    """Verifies `draft` (a tree) after the pending `token`; returns (nodes verified, tokens produced).

    Nodes deeper than `room` could only be accepted past max_tokens, so they are cut before the forward.
    """
    if len(draft) > max_nodes:  # checked before the cut, so it does not depend on how far max_tokens is
        raise RuntimeError(f"{type(proposer).__name__} drafted a tree of {len(draft)} nodes, more than {max_nodes}")
    tree, kept = prune_to_depth(draft, room)
    assert tree.parents is not None
    parents = [-1, *(p + 1 for p in tree.parents)]
    if params.greedy and runtime.scores_head_slices:  # only the rows of nodes not yet known rejected
        verified = runtime.forward([token, *tree.tokens], parents=parents, capture=capture, logit_rows=None)
        assert verified.final_hidden is not None
        outcome = verify_greedy_early_exit(tree.tokens, verified.final_hidden, runtime.head_logits,
                                           runtime.vocab_size, parents=tree.parents)
    else:
        verified = runtime.forward([token, *tree.tokens], parents=parents, capture=capture)
        assert verified.logits is not None
        outcome = _verify_tree(tree, verified.logits, params, generator)
    runtime.commit([0, *(i + 1 for i in outcome.path)])
    if len(kept) < len(draft):
        verified = _rows_at(verified, kept, len(draft))
    proposer.feedback(outcome.num_accepted, verified, path=[kept[i] for i in outcome.path])
    return len(tree), [*(tree.tokens[i] for i in outcome.path), outcome.next_token]
