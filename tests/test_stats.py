"""SpecDecodingStats: counting conventions, derived rates, merging."""

from __future__ import annotations

import pytest

from specdec.engine.stats import SpecDecodingStats


def recorded(steps: list[tuple[int, int]]) -> SpecDecodingStats:
    s = SpecDecodingStats(num_requests=1)
    for drafted, accepted in steps:
        s.record_step(drafted, accepted)
    return s


def test_record_step_counts():
    s = recorded([(4, 4), (4, 1), (0, 0), (2, 0), (3, 2)])
    assert s.num_steps == 5
    assert s.num_drafts == 4  # the empty draft is a step without a draft
    assert s.num_draft_tokens == 13
    assert s.num_accepted_tokens == 7
    assert s.drafted_per_position == [4, 4, 3, 2]
    assert s.accepted_per_position == [3, 2, 1, 1]
    assert s.acceptance_rate == pytest.approx(7 / 13)
    assert s.mean_acceptance_length == pytest.approx((7 + 5) / 5)
    assert s.acceptance_rate_per_position == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 2])


def test_plain_decoding_has_mean_acceptance_length_one():
    s = recorded([(0, 0)] * 6)
    assert (s.num_steps, s.num_drafts, s.acceptance_rate, s.mean_acceptance_length) == (6, 0, 0.0, 1.0)
    assert s.drafted_per_position == [] and s.acceptance_rate_per_position == []


def test_empty_stats_do_not_divide_by_zero():
    s = SpecDecodingStats()
    assert (s.acceptance_rate, s.mean_acceptance_length, s.tokens_per_second) == (0.0, 0.0, 0.0)


def test_merge_adds_counts_and_per_position_lists():
    a = recorded([(2, 2), (2, 0)])
    a.num_generated_tokens, a.total_seconds = 5, 1.0
    b = recorded([(5, 3)])
    b.num_generated_tokens, b.total_seconds = 5, 0.5
    total = SpecDecodingStats().merge(a).merge(b)
    assert total.num_requests == 2 and total.num_steps == 3
    assert (total.num_draft_tokens, total.num_accepted_tokens) == (9, 5)
    assert total.drafted_per_position == [3, 3, 1, 1, 1]
    assert total.accepted_per_position == [2, 2, 1]
    assert total.tokens_per_second == pytest.approx(10 / 1.5)
    # merging a shorter list into a longer one works too, and the inputs are not modified
    assert SpecDecodingStats().merge(b).merge(a).drafted_per_position == [3, 3, 1, 1, 1]
    assert a.drafted_per_position == [2, 2] and b.drafted_per_position == [1, 1, 1, 1, 1]


def test_to_dict_and_summary():
    s = recorded([(4, 3), (4, 4)])
    s.num_generated_tokens, s.total_seconds = 9, 2.0
    d = s.to_dict()
    assert d["acceptance_rate"] == 0.875 and d["mean_acceptance_length"] == 4.5
    assert d["accepted_per_position"] == [2, 2, 2, 1] and d["acceptance_rate_per_position"] == [1.0, 1.0, 1.0, 0.5]
    assert d["tokens_per_second"] == 4.5
    line = s.summary_line()
    assert "0.87500" in line and "7 accepted" in line and "8 drafted" in line and "4.50" in line


def test_tree_steps_count_positions_by_depth():
    """A 10-node tree of depth 3 offers 3 positions; its kept path of 2 accepts positions 1 and 2."""
    s = SpecDecodingStats()
    s.record_step(10, 2, positions=3)
    s.record_step(6, 0, positions=2)
    assert s.num_draft_tokens == 16 and s.num_accepted_tokens == 2
    assert s.drafted_per_position == [2, 2, 1]
    assert s.accepted_per_position == [1, 1]
    assert s.acceptance_rate_per_position == [0.5, 0.5, 0.0]
