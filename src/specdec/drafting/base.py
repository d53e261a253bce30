"""The one interface every drafting method implements.

A proposer never touches the target's KV cache. Each step it sees the committed tokens plus the pending
last token, and returns a draft: token ids and, when they were sampled from a distribution, that
distribution (None means point masses: n-gram continuations, argmax drafts). After verification it is
told how many of its tokens were accepted (for a tree: which path), so it can roll back any state of its own.

Tree drafts: `tokens` are the nodes in topological order (parents before children), `parents[i]` is the
index in `tokens` of node i's parent, or -1 when its parent is the root (the pending last token, which is
not in the draft). `probs` None: every node is a point mass (deterministic top-k children); otherwise row i
is the distribution node i was drawn from (e.g. siblings i.i.d. from their parent's distribution). The engine
verifies one forward over [root, *tokens] and keeps one root-to-node path. A tree has fewer than
MAX_TOKENS_PER_FORWARD nodes; its depth should be at most `max_tokens` (the engine cuts deeper nodes off).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel
    from specdec.models.runtime import ForwardResult
    from specdec.sampling_params import SamplingParams


@dataclass
class Draft:
    tokens: list[int]  # [k] proposed token ids, in order
    probs: torch.Tensor | None = None  # [k, vocab] distribution each token was sampled from; None = point masses
    parents: list[int] | None = None  # tree drafts: parent index per token (-1 = root); None = chain

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft(tokens=[])

# Pending committed positions beyond which a proposer's `catch_up_batch` reads them before drafting (timed
# apart by the engine); fewer are read by the drafting step itself
CATCH_UP_ROWS = 16


class Proposer(ABC):
    """Base class of drafting methods; register subclasses with `@register("name")`."""

    Options: ClassVar[type]  # dataclass of this method's speculative_config keys
    # The chance that a draft token is kept given that the one before it was, which the "auto" draft-length
    # policy assumes for positions it has not measured yet; None: the first position's own rate (a geometric
    # guess, scheduling/draft_length.py). A method whose errors come in runs (a lookup copy is right until
    # the copied text and the output part) sets it.
    continuation_prior: ClassVar[float | None] = None
    # residual-stream indices (see ModelRuntime.forward) the proposer wants from every target forward
    target_layers: tuple[int, ...] = ()

    def __init__(self, options: object, target: LoadedModel) -> None:
        self.options = options
        self.target = target

    @property
    def num_speculative_tokens(self) -> int:
        return int(getattr(self.options, "num_speculative_tokens"))

    def begin(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        generator: torch.Generator | None,
        capacity: int,
        prefill: ForwardResult | None = None,
    ) -> None:
        """Starts a request. `prefill` holds the target's prompt forward (hidden states of target_layers)."""

    @abstractmethod
    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        """Drafts up to `max_tokens` tokens to follow `tokens` (committed tokens plus the pending last one)."""

    @classmethod
    def propose_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]],
                      max_tokens: Sequence[int]) -> list[Draft]:
        """`proposers[i].propose(tokens[i], max_tokens[i])` for every i (all of this class), in one batched
        step where the method has one (a drafter network forwarding every sequence at once); each draft must
        be the one `propose` would give. This default drafts one sequence after another."""
        return [p.propose(t, m) for p, t, m in zip(proposers, tokens, max_tokens)]

    @classmethod
    def catch_up_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]]) -> None:
        """Brings the proposers' own state up to `tokens` where it has fallen behind (a prompt, or many steps
        without a draft), before a `propose_batch` of the same arguments; `propose` must do the same by
        itself. The engine times it apart from drafting: the auto policy prices a draft by what drafting
        more or fewer tokens costs, and this cost is the same for any draft length."""

    def counters(self) -> dict[str, int]:
        """Method-specific running counts for reports (e.g. hybrid: steps drafted by each part)."""
        return {}

    def feedback(
        self, num_accepted: int, verified: ForwardResult | None = None, path: Sequence[int] | None = None
    ) -> None:
        """Told after verification how many draft tokens were accepted, with the target's forward over
        [root, *draft.tokens] (row i + 1 = draft token i). Chains: the first `num_accepted` tokens, path None.
        Trees: `path` = indices into this proposer's draft of the kept nodes, root to node (len num_accepted);
        rows of nodes the engine cut off (too deep for max_tokens) are zeros."""
