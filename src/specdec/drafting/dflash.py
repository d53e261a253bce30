"""DFlash drafting: one drafter forward per step proposes up to block_size - 1 tokens, verified as a chain.

The drafter's context cache holds the keys/values of committed positions only, built from the target's
layer outputs at those positions (prefill, then the verified rows each `feedback` reports). Each step the
block [pending token, MASK x (B-1)] sits at positions len(tokens) - 1 ... and attends to the whole cache
plus itself. Drafts are the argmax per slot: point masses, so the engine's verification stays exact under
greedy decoding and under sampling (accept x with probability p(x), else resample from p without x).

Optionally (tree_top_k > 1) the same forward yields a draft tree: slot i's distribution does not depend on
the tokens drafted before it, so the EAGLE-2 grow/rerank of dynamic_tree.py runs on the per-slot
log-probabilities alone (path score = sum of the slots' log-probs), without a second drafter forward.

The sequences of a batch that share a drafter draft in one block forward (`propose_batch`, dflash_batch.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specdec.drafting.base import CATCH_UP_ROWS, Draft, Proposer
from specdec.drafting.confidence import threshold_problems
from specdec.drafting.context_vocab import ContextVocab
from specdec.drafting.dflash_batch import add_pending, draft_blocks
from specdec.drafting.dflash_format import load_dflash
from specdec.drafting.dflash_model import ContextCache
from specdec.drafting.drafter_format import shared_drafter
from specdec.drafting.dynamic_tree import grow_tree
from specdec.drafting.option_checks import draft_shape_problems
from specdec.drafting.registry import register
from specdec.drafting.shipped import resolve_drafter

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel
    from specdec.models.runtime import ForwardResult
    from specdec.sampling_params import SamplingParams


@dataclass
class DFlashOptions:
    model: str
    # draft tokens per step; a drafter proposes at most block_size - 1 (its whole block), larger values use that
    num_speculative_tokens: int = 15
    tree_top_k: int = 1  # > 1: verify a tree of each slot's top candidates (the tree's depth is the above)
    tree_num_draft_tokens: int = 24  # tree nodes kept after reranking
    # also propose the request's context tokens outside the draft vocabulary (context_vocab.py)
    context_vocab: bool = True
    # chain only: end the chain at the first slot whose top probability is below this (that slot is still
    # verified); the drafter's forward costs the same, but a CPU pays for every verified row (confidence.py)
    confidence_threshold: float = 0.0

    def problems(self) -> list[str]:
        out = threshold_problems(self.confidence_threshold)
        if self.confidence_threshold > 0 and self.tree_top_k > 1:
            out.append("confidence_threshold applies to chain drafts (tree_top_k 1); a tree keeps its "
                       "tree_num_draft_tokens best nodes instead")
        return out + draft_shape_problems(self.num_speculative_tokens, self.tree_top_k, self.tree_num_draft_tokens,
                                          max_length=63)


@register("dflash")
class DFlashProposer(Proposer):
    Options = DFlashOptions

    def __init__(self, options: DFlashOptions, target: LoadedModel) -> None:
        super().__init__(options, target)
        if target.decoder is None:
            raise ValueError("dflash needs the target's hidden states, which only the native runtime provides")
        decoder = target.decoder
        path = resolve_drafter(options.model)
        drafter = self.drafter = shared_drafter(target, "dflash", path,
                                                lambda: load_dflash(path, target)[0].ready_for(target))
        self.target_layers = drafter.config.runtime_layers
        self.vocab = ContextVocab(self.drafter.draft_ids(), self.drafter._head, decoder.head_weight(),
                                  enabled=options.context_vocab)
        self.k = min(options.num_speculative_tokens, drafter.config.block_size - 1)
        self.cache: ContextCache | None = None
        self.pending: torch.Tensor | None = None  # target features of committed positions not yet in the cache

    @property
    def num_speculative_tokens(self) -> int:
        return self.k

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, generator: torch.Generator | None,
              capacity: int, prefill: ForwardResult | None = None) -> None:
        if prefill is None:
            raise ValueError("dflash needs the target's prefill forward")
        self.cache = ContextCache(self.drafter.config, capacity, self.target.dtype, self.target.device)
        self.pending = self._features(prefill, range(len(prompt)))
        self.vocab.start(prompt)
        # the prompt's context entries are made by the first step that drafts (catch_up_batch): a request
        # that the auto policy never gives a draft costs no drafter work at all (a 500-token prompt's took
        # about 1% of its 128 tokens' decoding on a 2-core AVX2 CPU)

    @classmethod
    def catch_up_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]]) -> None:
        """The context entries of every proposer with more than CATCH_UP_ROWS pending positions (a prompt, or
        steps without a draft), one context call per drafter; the rest are made by the drafting step."""
        by_drafter: dict[int, list[DFlashProposer]] = {}
        for p in proposers:
            if isinstance(p, DFlashProposer) and p.pending is not None and p.pending.shape[0] > CATCH_UP_ROWS:
                by_drafter.setdefault(id(p.drafter), []).append(p)
        for group in by_drafter.values():
            add_pending(group)

    def _features(self, result: ForwardResult, rows: Sequence[int]) -> torch.Tensor:
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.target.device)
        return torch.cat([result.hidden[i][index] for i in self.target_layers], dim=-1)

    @torch.inference_mode()
    def _add_pending(self) -> None:
        """The context entries of the committed positions whose target features arrived since the last."""
        assert self.cache is not None
        if self.pending is not None:
            start, n = self.cache.length, self.pending.shape[0]
            positions = torch.arange(start, start + n, device=self.target.device)
            self.cache.append(self.drafter.context_kv(self.drafter.context(self.pending), positions))
            self.pending = None

    @torch.inference_mode()
    def _ingest(self, tokens: Sequence[int]) -> None:
        """Adds the pending committed positions to the context cache: everything before the pending token."""
        self._add_pending()
        self._check_step(tokens)

    def _check_step(self, tokens: Sequence[int]) -> None:
        assert self.cache is not None
        if self.cache.length + 1 != len(tokens):
            raise RuntimeError(f"dflash state out of step: {self.cache.length} cached positions, {len(tokens)} tokens")

    @torch.inference_mode()
    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        assert self.cache is not None
        self._ingest(tokens)
        self.vocab.follow(tokens)
        k = min(self.k, max_tokens)
        if k <= 0:
            return Draft(tokens=[])
        dev, b = self.target.device, self.drafter.config.block_size
        # always the whole block: the drafter was trained on full blocks and its attention is bidirectional
        block = self.drafter.block_tokens(torch.tensor([tokens[-1]], device=dev))
        positions = torch.arange(len(tokens) - 1, len(tokens) - 1 + b, device=dev)[None]
        h = self.drafter.blocks(block, positions, self.cache.views(), None)[0]
        return self._draft(self.vocab.logits(self.drafter.norm(h[1 : 1 + k])))

    @classmethod
    def propose_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]],
                      max_tokens: Sequence[int]) -> list[Draft]:
        """The sequences sharing a drafter in one block forward (dflash_batch.py); every draft is the one
        `propose` gives (chains, thresholds and trees alike: all come from the block's slot logits)."""
        out: list[Draft | None] = [None] * len(proposers)
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(proposers):
            if not isinstance(p, DFlashProposer):
                raise TypeError("propose_batch takes dflash proposers only")
            groups.setdefault(id(p.drafter), []).append(i)
        for members in groups.values():
            drafts = draft_blocks([proposers[i] for i in members], [tokens[i] for i in members],  # type: ignore[misc]
                                  [max_tokens[i] for i in members])
            for i, d in zip(members, drafts):
                out[i] = d
        return [d for d in out if d is not None]

    def _draft(self, logits: torch.Tensor) -> Draft:
        """The draft from the block's slot logits [k, vocab]: a tree, or the chain (to the first unsure slot)."""
        if self.options.tree_top_k > 1:
            return self._tree(logits)
        k = logits.shape[0]
        top = logits.max(-1)
        if self.options.confidence_threshold > 0:
            unsure = torch.softmax(logits.float(), dim=-1).max(-1).values < self.options.confidence_threshold
            if unsure.any():
                k = int(unsure.nonzero()[0]) + 1
        drafted = self.vocab.to_target(top.indices[:k])
        return Draft(tokens=[int(t) for t in drafted.tolist()])

    def _tree(self, logits: torch.Tensor) -> Draft:
        logprobs = torch.log_softmax(logits, dim=-1).cpu()

        def expand(frontier: list[int], nodes: list) -> torch.Tensor:
            # children of a depth-d node are slot d + 1's candidates, whatever the node's own token
            return logprobs[nodes[frontier[0]].depth].expand(len(frontier), -1)

        o = self.options
        nodes = grow_tree(logprobs[0], expand, o.tree_top_k, logits.shape[0], o.tree_num_draft_tokens)
        ids = self.vocab.to_target(torch.tensor([n.token for n in nodes], device=logits.device))
        return Draft(tokens=[int(t) for t in ids.tolist()], parents=[n.parent for n in nodes])

    def feedback(self, num_accepted: int, verified: ForwardResult | None = None,
                 path: Sequence[int] | None = None) -> None:
        if verified is None:
            raise RuntimeError("dflash needs the verification forward's hidden states")
        kept = [0, *(i + 1 for i in path)] if path is not None else list(range(num_accepted + 1))
        new = self._features(verified, kept)
        # a step without a draft (no room left) still commits rows: keep them after any not yet ingested
        self.pending = new if self.pending is None else torch.cat([self.pending, new])
