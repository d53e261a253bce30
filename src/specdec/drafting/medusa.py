"""Medusa drafting: the heads read the target's final hidden state at the last committed position and
fill a candidate tree; the engine verifies it in one forward (lossless, greedy and sampled).

The root of the tree is the pending token, which the target itself chose from that same hidden state, so
head k's candidates sit at depth k + 1. With `tree_top_k` the tree is instead grown at every step from the
heads' own probabilities (EAGLE-2's growth and rerank, dynamic_tree.py: a path scores the product of its
heads' probabilities, as the static tree scores the product of their measured accuracies), so a step where
head 0 is sure spends its nodes deeper and an unsure one spends them wider. There is no draft forward
beyond the heads: the verification forward's final hidden state at the last kept node is the input of the
next step. Medusa's "typical acceptance" is not offered (it changes the output distribution).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specdec.drafting.base import Draft, Proposer
from specdec.drafting.confidence import threshold_problems
from specdec.drafting.context_vocab import ContextVocab
from specdec.drafting.drafter_format import shared_drafter
from specdec.drafting.dynamic_tree import TreeNode, grow_tree, min_score
from specdec.drafting.medusa_format import load_medusa
from specdec.drafting.medusa_model import (
    TOP_K,
    MedusaHeads,
    choice_problems,
    prior_accuracy,
    sort_paths,
    tree_from_accuracy,
    tree_parents,
)
from specdec.drafting.option_checks import draft_shape_problems
from specdec.drafting.registry import register
from specdec.drafting.shipped import resolve_drafter
from specdec.models.fast_linear import linear_float

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel
    from specdec.models.runtime import ForwardResult
    from specdec.sampling_params import SamplingParams


@dataclass
class MedusaOptions:
    model: str
    num_speculative_tokens: int = 4  # deepest tree level used (at most the drafter's number of heads)
    medusa_choices: list | None = None  # explicit tree: paths of per-head ranks, e.g. [[0], [1], [0, 0]]
    tree_num_draft_tokens: int = 24  # nodes of the default tree (built from the heads' measured accuracy)
    # grow the tree per step from the heads' probabilities instead, `tree_top_k` children per expanded node
    # (SGLang's --speculative-eagle-topk); None = the static tree
    tree_top_k: int | None = None
    confidence_threshold: float = 0.0  # dynamic tree: stop growing below this path probability
    # also propose the request's context tokens outside the draft vocabulary (context_vocab.py)
    context_vocab: bool = True

    def problems(self) -> list[str]:
        out = draft_shape_problems(self.num_speculative_tokens, self.tree_top_k, self.tree_num_draft_tokens,
                                   max_top_k=TOP_K)
        out += threshold_problems(self.confidence_threshold)
        if self.tree_top_k is not None:
            if self.medusa_choices is not None:
                out.append("tree_top_k grows a tree per step; medusa_choices fixes one: give one or the other")
        elif self.confidence_threshold > 0:
            out.append("confidence_threshold applies to the dynamic tree only: set tree_top_k too")
        if self.medusa_choices is not None:
            if not all(isinstance(p, list) for p in self.medusa_choices):
                out.append("medusa_choices must be a list of paths (lists of ranks)")
            else:
                out += choice_problems(self.medusa_choices)
        return out


@register("medusa")
class MedusaProposer(Proposer):
    Options = MedusaOptions

    def __init__(self, options: MedusaOptions, target: LoadedModel) -> None:
        super().__init__(options, target)
        if target.decoder is None:
            raise ValueError("medusa needs the target's final hidden states, which only the native runtime provides")
        path = resolve_drafter(options.model)

        def build() -> tuple[MedusaHeads, dict[str, Any]]:
            heads, config = load_medusa(path, target)
            heads = heads.to(device=target.device, dtype=target.dtype).eval()
            if not heads.config.own_lm_heads:  # own projections score the static vocabulary (own_static_logits)
                heads.attach_target(target.decoder.head_weight())
            return heads, config

        self.heads, config = shared_drafter(target, "medusa", path, build)
        c = self.heads.config
        self.vocab = ContextVocab(self.heads.draft_ids(), self.heads.head_rows_of(0), target.decoder.head_weight(),
                                  softcap=c.logit_softcap, enabled=options.context_vocab)
        depth = min(options.num_speculative_tokens, c.num_heads)
        if options.medusa_choices is not None:
            problems = choice_problems(options.medusa_choices, c.num_heads)
            if problems:
                raise ValueError("invalid speculative_config: " + "; ".join(problems))
            paths = [p for p in sort_paths(options.medusa_choices) if len(p) <= depth]
        else:
            accuracy = config.get("specdec", {}).get("head_rank_accuracy") or prior_accuracy(c.num_heads)
            paths = tree_from_accuracy(accuracy, options.tree_num_draft_tokens, depth)
        top = min(TOP_K, c.draft_vocab_size)
        paths = [p for p in paths if max(p) < top]  # a tiny draft vocab has fewer ranks; prefixes stay in
        self.paths, self.parents = paths, tree_parents(paths)
        self.top = max(max(p) for p in paths) + 1
        self.head_of = torch.tensor([len(p) - 1 for p in paths], device=target.device)
        self.rank_of = torch.tensor([p[-1] for p in paths], device=target.device)
        self.count_within = [sum(1 for p in paths if len(p) <= d) for d in range(depth + 1)]  # paths sorted by depth
        self.depth = max(len(p) for p in paths) if options.tree_top_k is None else depth
        self.hidden: torch.Tensor | None = None  # [1, H] final hidden state at the last committed position

    @property
    def num_speculative_tokens(self) -> int:
        return self.depth

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, generator: torch.Generator | None,
              capacity: int, prefill: ForwardResult | None = None) -> None:
        if prefill is None or prefill.final_hidden is None:
            raise ValueError("medusa needs the target's prefill forward")
        self.hidden = prefill.final_hidden[-1:]
        self.vocab.start(prompt)

    @torch.inference_mode()
    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        assert self.hidden is not None
        if self._count(max_tokens) == 0:
            return Draft(tokens=[])
        states = torch.cat([self.heads.head_state(k, self.hidden) for k in range(self.heads.config.num_heads)])
        return self._draft(tokens, max_tokens, states, self.heads.own_static_logits(states))

    def _count(self, max_tokens: int) -> int:
        depth = min(max_tokens, self.depth)
        return depth if self.options.tree_top_k is not None else self.count_within[depth]

    @classmethod
    def propose_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]],
                      max_tokens: Sequence[int]) -> list[Draft]:
        """Every sequence's heads in one call per head, and the static vocabulary's logits of every
        sequence's heads in one call (per head for heads with their own projections); the context tokens'
        columns and the tree stay per sequence. Every draft is the one `propose` gives: the heads' linears are
        row-invariant in bfloat16 on CPU."""
        out: list[Draft] = [Draft(tokens=[]) for _ in proposers]
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(proposers):
            if not isinstance(p, MedusaProposer):
                raise TypeError("propose_batch takes medusa proposers only")
            if p._count(max_tokens[i]) > 0:
                groups.setdefault(id(p.heads), []).append(i)
        with torch.inference_mode():
            for members in groups.values():
                ps = [proposers[i] for i in members]
                heads = ps[0].heads  # type: ignore[attr-defined]
                hidden = torch.cat([p.hidden for p in ps])  # type: ignore[attr-defined]
                states = torch.stack([heads.head_state(k, hidden) for k in range(heads.config.num_heads)], dim=1)
                n, h, width = states.shape
                if heads.config.own_lm_heads:
                    rows = [heads.projection(k).weight for k in range(h)]
                    static = torch.stack([linear_float(states[:, k].to(w.dtype), w) for k, w in enumerate(rows)],
                                         dim=1)
                else:
                    shared = ps[0].vocab.static_rows  # type: ignore[attr-defined]
                    static = linear_float(states.reshape(n * h, width).to(shared.dtype), shared).view(n, h, -1)
                for row, i in enumerate(members):
                    out[i] = proposers[i]._draft(tokens[i], max_tokens[i], states[row], static[row])  # type: ignore[attr-defined]
        return out

    def _draft(self, tokens: Sequence[int], max_tokens: int, states: torch.Tensor,
               static_logits: torch.Tensor | None) -> Draft:
        """The draft from the heads' states [heads, H] (and their own projections' static logits)."""
        depth = min(max_tokens, self.depth)
        grown = self.options.tree_top_k is not None
        count = self._count(max_tokens)  # a grown tree fills whatever depth is left
        self.vocab.follow(tokens)
        logits = self.vocab.logits(states, static_logits)  # [heads, vocab]
        if grown:
            return self._grown(logits, depth)
        top = logits.topk(self.top, dim=-1).indices
        draft_ids = top[self.head_of[:count], self.rank_of[:count]]
        ids = self.vocab.to_target(draft_ids).tolist()
        return Draft(tokens=[int(t) for t in ids], parents=self.parents[:count])

    def _grown(self, logits: torch.Tensor, depth: int) -> Draft:
        """The dynamic tree: every node at depth d expands with head d's distribution (the heads do not
        see the drafted tokens, so siblings' children share it)."""
        logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()

        def expand(frontier: list[int], nodes: list[TreeNode]) -> torch.Tensor:
            return logprobs[nodes[frontier[0]].depth].expand(len(frontier), -1)  # one level per round

        nodes = grow_tree(logprobs[0], expand, self.options.tree_top_k, depth, self.options.tree_num_draft_tokens,
                          min_score(self.options.confidence_threshold))
        ids = self.vocab.to_target(torch.tensor([n.token for n in nodes], device=logits.device)).tolist()
        return Draft(tokens=[int(t) for t in ids], parents=[n.parent for n in nodes])

    def feedback(self, num_accepted: int, verified: ForwardResult | None = None,
                 path: Sequence[int] | None = None) -> None:
        if verified is None or verified.final_hidden is None:
            raise RuntimeError("medusa needs the verification forward's final hidden states")
        row = (path[-1] + 1 if path else 0) if path is not None else num_accepted
        self.hidden = verified.final_hidden[row : row + 1]
