"""`--max-minutes`: training stops at an optimizer-step boundary once its wall-clock budget is spent, saves
a usable drafter, can be resumed with a longer budget, and its learning rate follows the time spent."""

from __future__ import annotations

import json

from specdec.training.train_medusa import train_medusa
from specdec.training.trainer import LOG_FILE, TrainSettings, _lr_factor

from test_training_safety import OPTIONS, samples, target  # noqa: F401 (fixtures)


def budget(max_minutes: float | None, max_steps: int = 10) -> TrainSettings:
    # 32-token samples, 64 tokens a step: two samples per optimizer step
    return TrainSettings(max_steps=max_steps, tokens_per_step=64, warmup_steps=2, checkpoint_every=100,
                         val_fraction=0.0, lr=1e-3, max_minutes=max_minutes)


def steps_logged(output) -> list[int]:
    return [json.loads(line)["step"] for line in (output / LOG_FILE).read_text().splitlines()]


def test_a_spent_budget_stops_after_one_whole_step_and_saves(target, samples, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    report = train_medusa(target, samples, out, budget(1e-9), OPTIONS, progress=False)
    assert report["steps"] == 1 and steps_logged(out) == [1]
    assert report["tokens_seen"] == 64  # both samples of the step: no accumulated gradient was dropped
    assert (out / "model.safetensors").is_file()


def test_a_stopped_run_resumes_with_a_longer_budget(target, samples, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    train_medusa(target, samples, out, budget(1e-9, max_steps=3), OPTIONS, progress=False)
    report = train_medusa(target, samples, out, budget(None, max_steps=3), OPTIONS, resume=True, progress=False)
    assert report["steps"] == 3 and steps_logged(out) == [1, 2, 3]


def test_the_learning_rate_follows_time_when_it_is_further_along():
    assert _lr_factor(5, 2, 100) > 0.99  # early by steps
    assert _lr_factor(5, 2, 100, time_fraction=1.0) == 0.1  # but the budget is spent: the floor
    assert _lr_factor(98, 2, 100, time_fraction=0.1) < 0.11  # steps further along than time: steps win
    assert _lr_factor(0, 2, 100, time_fraction=1.0) == 0.5  # warm-up is by steps alone
