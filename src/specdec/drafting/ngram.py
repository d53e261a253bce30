"""N-gram prompt lookup: continue the most recent earlier occurrence of the context's last n tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from specdec.drafting.base import Draft, Proposer
from specdec.drafting.option_checks import out_of_range
from specdec.drafting.registry import register


@dataclass
class NgramOptions:
    num_speculative_tokens: int = 5
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    # "auto"'s cap when the config names none: lookup drafts cost next to nothing and the policy prices each
    # row, so a lone sequence may run past the fixed default (16 other_kinds prompts, B=1, one run on a Zen 4:
    # "auto" capped at 12 beat k=5, 7 and 10 by 28-67%). 15: on CPUs whose bf16 linears run on AMX tiles, 16
    # verification rows cost about one, and capped at 15 "auto" beat its former cap of 10 by 8% on
    # other_kinds and 9% on MT-Bench (one run each, docs/benchmarks.md), while 31 lost 3% to 15
    auto_max_speculative_tokens: ClassVar[int] = 15

    def problems(self) -> list[str]:
        out = out_of_range("num_speculative_tokens", self.num_speculative_tokens, 1, 63)
        if self.prompt_lookup_min < 1:
            out.append(f"prompt_lookup_min must be >= 1, got {self.prompt_lookup_min}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            out.append(
                f"prompt_lookup_max ({self.prompt_lookup_max}) must be >= prompt_lookup_min ({self.prompt_lookup_min})"
            )
        return out


def find_continuation(tokens: np.ndarray, ngram_min: int, ngram_max: int, k: int) -> list[int]:
    """Longest n-gram first (n from ngram_max down to ngram_min): find the latest earlier position where the
    last n tokens occur and return the k tokens that followed it there.

    The copy may run into the context's own end, and then continues with what it has just copied (as an
    LZ77 decoder does), so periodic output such as `a b a b a` drafts `b a b ...` at full length.
    """
    return find_match(tokens, ngram_min, ngram_max, k)[0]


def find_match(tokens: np.ndarray, ngram_min: int, ngram_max: int, k: int) -> tuple[list[int], int]:
    """`find_continuation`'s draft and the length n of the n-gram it matched (([], 0) when none matched)."""
    length = len(tokens)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        suffix = tokens[length - n :]
        # starts s with tokens[s:s+n] == suffix, s + n < length (something follows)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            period = length - start
            return [int(tokens[start + (j % period)]) for j in range(k)], n
    return [], 0


@register("ngram")
class NgramProposer(Proposer):
    Options = NgramOptions
    # a copy is right until the copied text and the output part: measured 0.87-0.93 a position on the
    # default model (docs/benchmarks.md, 2026-12-05 21:00), against a geometric guess of r0 (about 0.6)
    continuation_prior = 0.85

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        k = min(self.options.num_speculative_tokens, max_tokens)
        if k <= 0:
            return Draft(tokens=[])
        ids = np.asarray(tokens, dtype=np.int64)
        return Draft(tokens=find_continuation(ids, self.options.prompt_lookup_min, self.options.prompt_lookup_max, k))
