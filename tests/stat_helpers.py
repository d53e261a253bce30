"""Goodness-of-fit helpers shared by the distribution tests."""

from __future__ import annotations

import numpy as np
from scipy import stats


def chi_square_pvalue(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """Chi-square goodness of fit of counts to probabilities (any shape, flattened). Cells expected below 5
    counts are pooled into one. A count where the probability is 0 fails outright (an impossible outcome)."""
    observed = np.asarray(observed, dtype=float).ravel()
    expected_probs = np.asarray(expected_probs, dtype=float).ravel()
    impossible = expected_probs <= 0
    assert observed[impossible].sum() == 0, "an outcome with target probability 0 occurred"
    observed, expected = observed[~impossible], expected_probs[~impossible] * observed.sum()
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return float(stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def sample_token_ids(llm, prompt: list[int], num_samples: int, max_tokens: int, **warp) -> np.ndarray:
    """The generated ids of `num_samples` requests seeded 0..num_samples-1, all submitted in one `generate`
    call, so they run batched (up to the LLM's max_num_seqs per forward) and each sample is drafted and
    verified inside a batch."""
    from specdec import SamplingParams

    params = [SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=True, **warp) for seed in range(num_samples)]
    outs = llm.generate([{"prompt_token_ids": prompt}] * num_samples, params)
    return np.array([o.outputs[0].token_ids for o in outs])


def assert_first_tokens_follow_the_target(llm, prompt: list[int], num_samples: int, warp: dict,
                                          exact: tuple[np.ndarray, np.ndarray], max_tokens: int = 3) -> None:
    """Samples `num_samples` continuations (sample_token_ids) and checks the joint law of the first two tokens
    and the law of the third against the target's exact ones (`exact`: the joint [V, V] and the third's [V])."""
    vocab = llm.model.vocab_size
    samples = sample_token_ids(llm, prompt, num_samples, max_tokens, **warp)
    joint12, p3 = exact
    pairs = np.bincount(samples[:, 0] * vocab + samples[:, 1], minlength=vocab * vocab)
    assert chi_square_pvalue(pairs, joint12) > 1e-4
    assert chi_square_pvalue(np.bincount(samples[:, 2], minlength=vocab), p3) > 1e-4
