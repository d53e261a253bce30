"""Prompt lookup or a learned drafter, chosen per step; lossless either way.

Greedy output of small models repeats itself, and an n-gram continuation costs no model call at all, while
the `fallback` drafter (any other method: eagle3, mtp, medusa, a draft model...) costs a drafter forward per
draft token but is often right where a short lookup match is wrong (chat). Where the context's last
n >= prompt_lookup_min tokens occurred before, `selection` picks the part that drafts:
- "adaptive": the part with the higher measured tokens per second on this request (source_stats.py:
  running averages of the tokens a step gains, lookup's by match length, and of each part's step time; a
  part declined for long drafts once so that its estimate stays current);
- "fixed" (default): always the lookup (Arctic Inference combines suffix decoding with its speculators this
  way). It stays the default because it measured faster: on benchmarks/prompts/held_out.jsonl (run
  held-out-before) "fixed" with prompt_lookup_min 3 gave a 2.22x decode speedup, "adaptive" with 2 gave 2.07x.
Elsewhere the fallback drafts. It sees every verification, also of steps it did not draft, so its own state
(EAGLE-3's features, MTP's hidden states) never falls behind.

Lossless as each part is: every step verifies one draft, either a chain of point masses (the lookup) or the
fallback's draft with its own distributions or tree. The choice reads only what came before the step
(committed tokens, step times), never the step's own random draws.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specdec.drafting.base import Draft, Proposer
from specdec.drafting.ngram import NgramOptions, find_match
from specdec.drafting.registry import get_method, register
from specdec.drafting.source_stats import FALLBACK, LOOKUP, SourceStats

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel
    from specdec.models.runtime import ForwardResult
    from specdec.sampling_params import SamplingParams

SELECTIONS = ("adaptive", "fixed")


def default_lookup_tokens() -> int:
    """The lookup draft's default length: free to make, so as many tokens as verification rows cost little.
    On CPUs whose bf16 kernels are the AMX build 16 rows cost about one, and 15 beat 7 by 17% on held_out
    and other_kinds (run hybrid-lookup15), by 5-12% over the 4-bit targets' plain decoding (runs
    quantized/other_kinds-xeon-hybrid15 and -amx-int8). Elsewhere 8 rows cost about what 6 do (the bf16 row
    kernel's blocks of 4), and 7 measured 2.96x decode on held_out against 2.64x for 5 (runs hybrid-k7,
    eagle3-long4-candidate)."""
    from specdec.models import fast_linear

    return 15 if fast_linear.kernel_isa() == "amx" else 7


@dataclass
class HybridOptions:
    fallback: dict[str, Any] = field(default_factory=dict)  # a speculative_config of another method
    num_speculative_tokens: int = field(default_factory=default_lookup_tokens)  # the lookup draft's length
    prompt_lookup_min: int = 2  # shorter matches go to the fallback
    prompt_lookup_max: int = 4
    selection: str = "fixed"  # which part drafts where lookup matches: see the module docstring

    def problems(self) -> list[str]:
        # the lookup part takes n-gram lookup's options, checked as that method checks them
        out = NgramOptions(self.num_speculative_tokens, self.prompt_lookup_min, self.prompt_lookup_max).problems()
        if self.selection not in SELECTIONS:
            out.append(f"selection must be one of {', '.join(map(repr, SELECTIONS))}, got {self.selection!r}")
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


@dataclass
class _Step:
    """The step in flight: drafted at one propose, verified, and timed at the next propose."""

    source: str
    match: int  # length of lookup's matched n-gram (0: none)
    lookup: list[int]  # lookup's draft, whichever part drafted
    started: float  # clock at propose
    length: int  # len(tokens) at propose
    verified: int = 0  # feedback calls since: one, or the next propose spans more than this step


@register("hybrid")
class HybridProposer(Proposer):
    Options = HybridOptions

    def __init__(self, options: HybridOptions, target: LoadedModel, fallback: Proposer | None = None) -> None:
        super().__init__(options, target)
        if fallback is None:  # tests pass one in
            from specdec.speculative_config import SpeculativeConfig

            # resolved for the target, as the hybrid's own config was (a bare fallback's stored default may
            # depend on its quantization and device)
            config = SpeculativeConfig.from_dict(options.fallback, getattr(target, "quantization", None),
                                                 getattr(target, "device", None))
            fallback = get_method(config.method)(config.options, target)
        self.fallback: Proposer = fallback
        self.target_layers = self.fallback.target_layers
        self.clock: Callable[[], float] = time.perf_counter  # injectable for tests
        self.stats = SourceStats()
        self.step: _Step | None = None
        self.drafted_by_lookup = 0  # steps, for the statistics of a run
        self.drafted_by_fallback = 0
        self.tokens_by = {LOOKUP: 0, FALLBACK: 0}  # tokens gained (accepted + 1) in each part's steps
        self.explored_steps = 0

    @property
    def num_speculative_tokens(self) -> int:
        return max(self.options.num_speculative_tokens, self.fallback.num_speculative_tokens)

    def counters(self) -> dict[str, int]:
        """Steps and tokens gained per part (a part's mean gain per step is tokens / steps), exploration steps."""
        return {"lookup_steps": self.drafted_by_lookup, "fallback_steps": self.drafted_by_fallback,
                "lookup_tokens": self.tokens_by[LOOKUP], "fallback_tokens": self.tokens_by[FALLBACK],
                "explored_steps": self.explored_steps}

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, generator: torch.Generator | None,
              capacity: int, prefill: ForwardResult | None = None) -> None:
        self.fallback.begin(prompt, sampling, generator, capacity, prefill)
        self.stats.reset()  # estimates are per request (a proposer serves one request after another)
        self.step = None

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        now = self.clock()
        self._settle(tokens, now)
        o = self.options
        k = min(o.num_speculative_tokens, max_tokens)
        lookup: list[int] = []
        match = 0
        if k > 0:
            lookup, match = find_match(np.asarray(tokens, dtype=np.int64), o.prompt_lookup_min, o.prompt_lookup_max, k)
        if o.selection == "fixed":
            source = LOOKUP if lookup else FALLBACK
        else:
            source = self.stats.choose(match if lookup else 0)
            if self.stats.exploring is not None:
                self.explored_steps += 1
        self.step = _Step(source, match, lookup, now, len(tokens))
        if source == LOOKUP:
            self.drafted_by_lookup += 1
            return Draft(tokens=lookup)
        self.drafted_by_fallback += 1
        return self.fallback.propose(tokens, max_tokens)

    def feedback(self, num_accepted: int, verified: ForwardResult | None = None,
                 path: Sequence[int] | None = None) -> None:
        # the fallback reads the kept rows of the forward whoever drafted it (a lookup draft is a chain)
        self.fallback.feedback(num_accepted, verified, path)
        step = self.step
        if step is not None:
            step.verified += 1
            if step.verified == 1:
                self.tokens_by[step.source] += num_accepted + 1
                self.stats.record_gain(step.source, step.match, num_accepted + 1)

    def _settle(self, tokens: Sequence[int], now: float) -> None:
        """Closes the previous step: its time, from its propose to this one, goes to the part that drafted it;
        and where the fallback drafted it beside a lookup draft, what lookup would have gained."""
        step, self.step = self.step, None
        if step is None or step.verified != 1:
            return
        self.stats.record_cost(step.source, now - step.started)
        if step.source == FALLBACK and step.lookup:
            committed = tokens[step.length :]  # the step's accepted tokens and the target's own next one
            same = 0
            while same < min(len(step.lookup), len(committed)) and step.lookup[same] == committed[same]:
                same += 1
            # Greedy: the committed tokens are the target's argmax continuation whatever was drafted, so the
            # lookup draft would have had exactly `same` tokens accepted, unless it matched all of them
            # (censored: it could have had more; skipped, which leans the estimate low; exploration corrects).
            # Sampling: lookup's token i is accepted with probability p(x_i), the chance that the target's
            # draw is x_i, so `same` is a noisy sample of lookup's acceptance, not the value it would have
            # had on this step (that depends on draws never made); the average smooths it.
            if same < len(committed):
                self.stats.record_gain(LOOKUP, step.match, same + 1)
