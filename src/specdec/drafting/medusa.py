"""Medusa drafting: the heads read the target's final hidden state at the last committed position and
fill a static candidate tree; the engine verifies it in one forward (lossless, greedy and sampled).

The root of the tree is the pending token, which the target itself chose from that same hidden state, so
head k's candidates sit at depth k + 1. There is no draft forward beyond the heads: the verification
forward's final hidden state at the last kept node is the input of the next step. Medusa's "typical
acceptance" is not offered (it changes the output distribution).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specdec.drafting.base import Draft, Proposer
from specdec.drafting.context_vocab import ContextVocab
from specdec.drafting.eagle3 import resolve_drafter_path
from specdec.drafting.medusa_format import load_medusa
from specdec.drafting.medusa_model import (
    TOP_K,
    choice_problems,
    prior_accuracy,
    sort_paths,
    tree_from_accuracy,
    tree_parents,
)
from specdec.drafting.registry import register

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
    # also propose the request's context tokens outside the draft vocabulary (context_vocab.py)
    context_vocab: bool = True

    def problems(self) -> list[str]:
        out = []
        if not 1 <= self.num_speculative_tokens <= 32:
            out.append(f"num_speculative_tokens must be in 1..32, got {self.num_speculative_tokens}")
        if not 1 <= self.tree_num_draft_tokens <= 63:
            out.append(f"tree_num_draft_tokens must be in 1..63, got {self.tree_num_draft_tokens}")
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
        heads, config = load_medusa(resolve_drafter_path(options.model), target)
        self.heads = heads.to(device=target.device, dtype=target.dtype).eval()
        self.heads.attach_target(target.decoder.head_weight())
        c = heads.config
        self.vocab = ContextVocab(self.heads.draft_ids(), self.heads._head, target.decoder.head_weight(),
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
        self.depth = max(len(p) for p in paths)
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
        count = self.count_within[min(max_tokens, self.depth)]
        if count == 0:
            return Draft(tokens=[])
        self.vocab.follow(tokens)
        states = torch.cat([self.heads.head_state(k, self.hidden) for k in range(self.heads.config.num_heads)])
        logits = self.vocab.logits(states)  # [heads, vocab]
        top = logits.topk(self.top, dim=-1).indices
        draft_ids = top[self.head_of[:count], self.rank_of[:count]]
        ids = self.vocab.to_target(draft_ids).tolist()
        return Draft(tokens=[int(t) for t in ids], parents=self.parents[:count])

    def feedback(self, num_accepted: int, verified: ForwardResult | None = None,
                 path: Sequence[int] | None = None) -> None:
        if verified is None or verified.final_hidden is None:
            raise RuntimeError("medusa needs the verification forward's final hidden states")
        row = (path[-1] + 1 if path else 0) if path is not None else num_accepted
        self.hidden = verified.final_hidden[row : row + 1]
