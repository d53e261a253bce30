"""The sampling half of the gate: seeded speculative samples against the target's exact probabilities.

A few cases' contexts are continued `num_tokens` tokens at temperature 1, `num_samples` times with seeds
seed..seed+n-1, speculatively and batched. The test is the chi-square goodness of fit tests/stat_helpers.py
applies on the tiny models (token counts against the target's softmax), extended to samples whose positions
have different contexts: each token's observed count O is compared with its expected count E, the sum of the
target's probabilities at every sampled position given the tokens sampled before it (computed here by the
target alone), through the covariance of O - E. Every sampled position of every sample counts.

Why several tokens and not the first: the first token is sampled from the prefill's logits, before any draft,
so it exercises the sampler but never verification. Drafts are verified from the second token on; a
verifier that keeps a drafted token it should have rejected puts too much mass on the drafted tokens, which
their counts show: on the default model (2 cases x 96 samples x 8 tokens, n-gram "auto") keeping every draft
gives a statistic near 1800 on about 40 df (p = 0), the exact verifier p = 0.34. Subtler bugs need more
samples: resampling from the target instead of the residual after a rejection moves only p(1 - p) of mass
per rejected draft, and gave p = 0.05 there (more --samples, or cases with likelier drafts, catch it). The
context is the prompt plus the start of the plain greedy answer, so sampling continues inside an answer,
where drafters propose.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.api import LLM
from specdec.check.cases import CheckCase
from specdec.engine.sequence import cache_capacity
from specdec.engine.stats import SpecDecodingStats
from specdec.models.runtime import ModelRuntime
from specdec.sampling_params import SamplingParams
from specdec.verification import sampling_probs

MIN_EXPECTED = 5.0  # tokens expected fewer times are left out (the chi-square approximation needs about 5)
TOP_TOKENS = 256  # per sampled position, the probabilities kept for the covariance
# Kinds whose answers copy from the prompt (identifiers, numbers, passages): most drafts per sampled token.
PREFERRED_KINDS = ("code", "math", "summarization", "rag", "translation")
Prefix = tuple[int, ...]


@dataclass
class SamplingResult:
    case_ids: list[str]
    num_samples: int
    num_tokens: int
    statistic: float
    df: int
    p_value: float
    stats: SpecDecodingStats  # drafts made while sampling: zero drafted tokens means verification went untested

    def to_dict(self, alpha: float) -> dict:
        return {
            "cases": self.case_ids,
            "samples_per_case": self.num_samples,
            "tokens_per_sample": self.num_tokens,
            "statistic": round(self.statistic, 3),
            "df": self.df,
            "p_value": self.p_value,
            "alpha": alpha,
            "drafted_tokens": self.stats.num_draft_tokens,
            "accepted_tokens": self.stats.num_accepted_tokens,
        }


def pick_cases(cases: Sequence[CheckCase], prompts: Sequence[list[int]], count: int) -> list[int]:
    """Indices of `count` cases, one per kind while kinds last: the preferred kinds first, shortest prompt
    first (every sample reads its whole context)."""
    rank = {k: n for n, k in enumerate(PREFERRED_KINDS)}
    order = sorted(range(len(cases)), key=lambda i: (rank.get(cases[i].kind, len(rank)), len(prompts[i]), i))
    picked, kinds = [], set()
    for i in order:
        if cases[i].kind not in kinds:
            picked.append(i)
            kinds.add(cases[i].kind)
    picked += [i for i in order if i not in picked]
    return picked[:count]


def sample(llm: LLM, context: list[int], num_samples: int, num_tokens: int, seed: int
           ) -> tuple[list[Prefix], SpecDecodingStats]:
    """`num_samples` continuations of `context`, seeds seed..seed+n-1, submitted together (run batched)."""
    params = [SamplingParams(temperature=1.0, max_tokens=num_tokens, seed=seed + j, ignore_eos=True)
              for j in range(num_samples)]
    outs = llm.generate([{"prompt_token_ids": context}] * num_samples, params)
    stats = SpecDecodingStats()
    for out in outs:
        stats.merge(out.spec_decoding_stats)
    return [tuple(o.outputs[0].token_ids) for o in outs], stats


class Tally:
    """Sampled tokens against the target: observed counts, expected counts (the sum of the target's
    distributions at every sampled position) and the covariance of their difference."""

    def __init__(self, vocab_size: int) -> None:
        self.observed = torch.zeros(vocab_size, dtype=torch.float64)
        self.expected = torch.zeros(vocab_size, dtype=torch.float64)
        self.impossible = 0  # sampled tokens the target gives probability 0
        self.rows: list[tuple[torch.Tensor, torch.Tensor]] = []  # each position's likeliest tokens, probabilities

    def add(self, probs: torch.Tensor, token: int) -> None:
        self.observed[token] += 1
        self.expected += probs
        self.impossible += int(probs[token] <= 0)
        top = torch.topk(probs, min(TOP_TOKENS, probs.numel()))
        self.rows.append((top.indices, top.values))

    def statistic(self) -> tuple[float, int]:
        """(O - E)' C^+ (O - E) over the tokens expected at least MIN_EXPECTED times, and its degrees of
        freedom (C's rank). C = sum over positions of diag(p) - p p' is the conditional covariance of O - E,
        so by the martingale central limit theorem the statistic is chi-square distributed; rarer tokens are
        left out (their sub-vector's covariance is the same block of C), not pooled."""
        if self.impossible:
            return math.inf, 1
        kept = torch.nonzero(self.expected >= MIN_EXPECTED).flatten()
        if len(kept) == 0:
            return 0.0, 0
        slot = torch.full_like(self.observed, -1, dtype=torch.long)
        slot[kept] = torch.arange(len(kept))
        p = torch.zeros(len(self.rows), len(kept), dtype=torch.float64)
        for r, (tokens, values) in enumerate(self.rows):
            where = slot[tokens]
            p[r, where[where >= 0]] = values[where >= 0]
        # off the diagonal only each row's likeliest tokens count: any other token has p < 1/TOP_TOKENS there
        cov = torch.diag(self.expected[kept]) - p.T @ p
        values, vectors = torch.linalg.eigh(cov)
        rank = values > values.max() * 1e-7
        z = vectors[:, rank].T @ (self.observed[kept] - self.expected[kept])
        return float((z**2 / values[rank]).sum()), int(rank.sum())


@torch.inference_mode()
def tally(runtime: ModelRuntime, context: list[int], samples: Sequence[Prefix]) -> Tally:
    """Every sampled token against the target's temperature-1 distribution after context + the tokens sampled
    before it: the context's cache is filled once, each sample's tokens forwarded on top and dropped again."""
    num_tokens = max(map(len, samples))
    runtime.reset(cache_capacity(len(context), num_tokens))
    first = runtime.prefill(context).logits
    assert first is not None
    result = Tally(runtime.vocab_size)
    last: Prefix | None = None
    for s in sorted(samples):  # samples that repeat come together: one forward for them all
        if s[:-1] != last:
            last, logits = s[:-1], first
            if len(s) > 1:
                rows = runtime.forward(list(s[:-1]), logit_rows="all").logits
                runtime.commit([])
                assert rows is not None
                logits = torch.cat([first[-1:], rows])
            probs = sampling_probs(logits, 1.0).double()
            probs /= probs.sum(dim=-1, keepdim=True)  # float32 rows sum to 1 within 1e-7 only
        for i, token in enumerate(s):
            result.add(probs[i], token)
    return result


def chi_square_sf(statistic: float, df: int) -> float:
    """P(X >= statistic) for X chi-square with df degrees of freedom (1 when df is 0: nothing was tested)."""
    if df == 0:
        return 1.0
    if math.isinf(statistic):
        return 0.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def run_sampling_check(llm: LLM, runtime: ModelRuntime, cases: Sequence[CheckCase], contexts: Sequence[list[int]],
                       num_samples: int, num_tokens: int, seed: int, progress: bool) -> SamplingResult:
    from tqdm import tqdm

    statistic, df, stats = 0.0, 0, SpecDecodingStats()
    for n, context in enumerate(tqdm(contexts, desc="sampling check", disable=not progress, leave=False)):
        samples, case_stats = sample(llm, context, num_samples, num_tokens, seed + n * num_samples)
        stats.merge(case_stats)
        s, d = tally(runtime, context, samples).statistic()
        statistic, df = statistic + s, df + d  # the cases are independent: statistics and df add
    return SamplingResult([c.id for c in cases], num_samples, num_tokens, statistic, df,
                          chi_square_sf(statistic, df), stats)
