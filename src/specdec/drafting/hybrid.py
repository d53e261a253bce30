"""Prompt lookup first, a learned drafter where lookup finds nothing.

Greedy output of small models repeats itself, and an n-gram continuation costs no model call at all, so
where the context's last n >= prompt_lookup_min tokens occurred before, this method drafts that
continuation; elsewhere it asks the `fallback` drafter (any other method: eagle3, mtp, medusa, a draft
model...), whose steps cost a drafter forward each. Arctic Inference combines suffix decoding with its
speculators the same way. The fallback sees every verification, also of steps it did not draft, so its
own state (EAGLE-3's features, MTP's hidden states) never falls behind.

Lossless as each part is: every step verifies one draft, either a chain of point masses (the lookup) or the
fallback's draft with its own distributions or tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specdec.drafting.base import Draft, Proposer
from specdec.drafting.ngram import NgramOptions, find_continuation
from specdec.drafting.registry import get_method, register

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel
    from specdec.models.runtime import ForwardResult
    from specdec.sampling_params import SamplingParams


@dataclass
class HybridOptions:
    fallback: dict[str, Any] = field(default_factory=dict)  # a speculative_config of another method
    num_speculative_tokens: int = 5  # length of a lookup draft
    prompt_lookup_min: int = 2  # shorter matches go to the fallback
    prompt_lookup_max: int = 4

    def problems(self) -> list[str]:
        # the lookup part takes n-gram lookup's options, checked as that method checks them
        out = NgramOptions(self.num_speculative_tokens, self.prompt_lookup_min, self.prompt_lookup_max).problems()
        if self.fallback.get("method") in (None, "hybrid", "ngram"):
            out.append("fallback must be a speculative_config with a learned or model 'method' "
                       "(eagle3, mtp, medusa, dflash, draft_model)")
        else:
            from specdec.speculative_config import SpeculativeConfig

            try:
                SpeculativeConfig.from_dict(self.fallback)
            except ValueError as exc:
                out.append(f"fallback: {exc}")
        return out


@register("hybrid")
class HybridProposer(Proposer):
    Options = HybridOptions

    def __init__(self, options: HybridOptions, target: LoadedModel) -> None:
        super().__init__(options, target)
        from specdec.speculative_config import SpeculativeConfig

        config = SpeculativeConfig.from_dict(options.fallback)
        self.fallback: Proposer = get_method(config.method)(config.options, target)
        self.target_layers = self.fallback.target_layers
        self.drafted_by_lookup = 0  # steps, for the statistics of a run
        self.drafted_by_fallback = 0

    @property
    def num_speculative_tokens(self) -> int:
        return max(self.options.num_speculative_tokens, self.fallback.num_speculative_tokens)

    def counters(self) -> dict[str, int]:
        return {"lookup_steps": self.drafted_by_lookup, "fallback_steps": self.drafted_by_fallback}

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, generator: torch.Generator | None,
              capacity: int, prefill: ForwardResult | None = None) -> None:
        self.fallback.begin(prompt, sampling, generator, capacity, prefill)

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        k = min(self.options.num_speculative_tokens, max_tokens)
        if k > 0:
            o = self.options
            found = find_continuation(np.asarray(tokens, dtype=np.int64), o.prompt_lookup_min, o.prompt_lookup_max, k)
            if found:
                self.drafted_by_lookup += 1
                return Draft(tokens=found)
        self.drafted_by_fallback += 1
        return self.fallback.propose(tokens, max_tokens)

    def feedback(self, num_accepted: int, verified: ForwardResult | None = None,
                 path: Sequence[int] | None = None) -> None:
        # the fallback reads the kept rows of the forward whoever drafted it (a lookup draft is a chain)
        self.fallback.feedback(num_accepted, verified, path)
