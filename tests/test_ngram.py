"""N-gram prompt lookup: which earlier occurrence is continued, and how much of it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from specdec.drafting.ngram import NgramOptions, NgramProposer, find_continuation


def cont(tokens, ngram_min=1, ngram_max=4, k=5):
    return find_continuation(np.asarray(tokens, dtype=np.int64), ngram_min, ngram_max, k)


def test_continues_the_match():
    assert cont([1, 2, 3, 4, 5, 9, 2, 3], k=2) == [4, 5]


def test_longest_ngram_wins_over_a_more_recent_shorter_one():
    # "3" last occurred at index 5 (followed by 7), but "2 3" occurs only at index 1 (followed by 4)
    assert cont([1, 2, 3, 4, 6, 3, 7, 2, 3], k=2) == [4, 6]
    assert cont([1, 2, 3, 4, 6, 3, 7, 2, 3], ngram_max=1, k=2) == [7, 2]


def test_most_recent_occurrence_of_the_same_ngram():
    assert cont([5, 1, 8, 5, 1, 9, 0, 5, 1], k=1) == [9]


def test_continuation_is_cut_at_k_and_runs_on_periodically_past_the_end():
    assert cont([1, 2, 3, 1, 2], k=10) == [3, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    assert cont([1, 2, 3, 1, 2], k=2) == [3, 1]
    assert cont([7, 7, 7, 7], k=5) == [7, 7, 7, 7, 7]  # the latest earlier "7 7 7" ends right before the last token


def test_no_match_and_ngram_min():
    assert cont([1, 2, 3, 4]) == []
    assert cont([1, 2, 3, 9, 3], ngram_min=2) == []  # only a 1-gram matches
    assert cont([1, 2, 3, 9, 2, 3], ngram_min=2, k=3) == [9, 2, 3]
    assert cont([4]) == []
    assert cont([4, 4], k=3) == [4, 4, 4]


def test_ngram_longer_than_the_context():
    assert cont([1, 2, 1], ngram_min=1, ngram_max=10, k=2) == [2, 1]


def proposer(**options) -> NgramProposer:
    return NgramProposer(NgramOptions(**options), target=SimpleNamespace())


def test_proposer_respects_max_tokens():
    p = proposer(num_speculative_tokens=4)
    tokens = [1, 2, 3, 4, 5, 6, 7, 1]
    assert p.propose(tokens, max_tokens=10).tokens == [2, 3, 4, 5]
    assert p.propose(tokens, max_tokens=2).tokens == [2, 3]
    assert p.propose(tokens, max_tokens=0).tokens == []
    assert p.propose(tokens, max_tokens=2).probs is None  # point masses


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(num_speculative_tokens=0), "num_speculative_tokens"),
        (dict(num_speculative_tokens=64), "num_speculative_tokens"),
        (dict(prompt_lookup_min=0), "prompt_lookup_min"),
        (dict(prompt_lookup_min=3, prompt_lookup_max=2), "prompt_lookup_max"),
    ],
)
def test_option_problems(options, message):
    problems = NgramOptions(**options).problems()
    assert len(problems) == 1 and message in problems[0]
    assert NgramOptions().problems() == []


def test_periodic_output_gets_a_full_draft():
    from specdec.drafting.ngram import find_continuation

    tokens = np.array([5, 7, 7, 7, 7])
    assert find_continuation(tokens, 1, 3, 4) == [7, 7, 7, 7]
    tokens = np.array([9, 1, 2, 1, 2, 1])
    assert find_continuation(tokens, 1, 2, 5) == [2, 1, 2, 1, 2]
