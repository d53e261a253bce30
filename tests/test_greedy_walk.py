"""greedy_walk: the tokens per step a greedy chain reaches on teacher-forced hits, as decoding counts them."""

from __future__ import annotations

import torch
from specdec.training.greedy_walk import greedy_walk, leading_runs
from specdec.training.trainer import estimated_acceptance_length


def test_a_run_is_the_leading_right_steps_and_an_unscored_step_ends_it():
    # positions before each drafted token: the pending token's position + the step
    hits = [(0, torch.tensor([5, 6, 7, 8]), torch.tensor([True, True, False, True])),
            (1, torch.tensor([6, 7, 9]), torch.tensor([True, False, True])),  # 7 not scored at step 1
            (2, torch.tensor([7, 9]), torch.tensor([False, True]))]
    assert leading_runs(hits) == {5: 2, 6: 1, 7: 0, 8: 2}


def test_the_walk_steps_past_each_run_and_the_targets_token():
    runs = {10: 2, 11: 5, 13: 0, 14: 3, 18: 1}
    # 10 keeps 2 (+1) -> 13 keeps 0 -> 14 keeps 3 -> 18 keeps 1 -> 20 = end
    assert greedy_walk(runs, 10, 20) == (3 + 1 + 4 + 2, 4)
    assert greedy_walk(runs, 10, 15) == (3 + 1 + 4, 3)  # the last step may run past the end, as a block does
    assert greedy_walk({10: 1}, 10, 20) == (2, 1)  # no run at 12: the walk stops


def test_decoding_spends_more_steps_on_hard_stretches_than_the_position_average_says():
    # half the positions easy (7 drafts right), half hard (none): per position 1 + 3.5 on average
    runs = {p: (7 if p < 80 else 0) for p in range(160)}
    tokens, steps = greedy_walk(runs, 0, 160)
    assert tokens / steps < 2.0  # 10 steps of 8 tokens, then 80 steps of one
    per_slot = [0.5] + [1.0] * 6  # the step accuracies of the same positions
    assert estimated_acceptance_length(per_slot) == 4.5
