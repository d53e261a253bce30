"""Training on prompt positions (prompt-only samples) and fine-tuning a drafter from an existing one."""

from __future__ import annotations

import json

import pytest
import torch
from specdec.bench.prompts import render_prompt
from specdec.cli import main
from specdec.drafting.eagle3_format import load_eagle3
from specdec.training import prompt_samples
from specdec.training.eagle3_objective import ttt_loss
from specdec.training.prompt_sources import TrainPrompt
from specdec.training.self_distill import Sample
from specdec.training.train_eagle3 import Eagle3Objective, Eagle3TrainOptions
from specdec.training.trainer import TrainSettings, train

from eagle3_helpers import greedy_samples, make_random_eagle3, write_data_dir


def _objective(target, samples, **options) -> Eagle3Objective:
    options.setdefault("draft_vocab_size", None if "init_from" in options else 256)
    return Eagle3Objective(target, samples, Eagle3TrainOptions(ttt_steps=3, **options), None, 0)


def test_prompt_positions_are_scored_only_when_asked(zoo):
    target = zoo.load("bigram")
    (sample,) = greedy_samples(target, 1, prompt_len=12, response_len=20)
    objective = _objective(target, [sample])
    ids = torch.tensor([*sample.prompt_ids, *sample.response_ids])
    feats = objective.features.get(ids.tolist())
    common = (objective.model, ids, len(sample.prompt_ids), feats, 3, 0.8, objective.t2d_index)
    _, only_response = ttt_loss(*common)
    _, with_prompt = ttt_loss(*common, score_prompt=True)
    # every step scores the 20 response tokens; the prompt adds its tokens 2+j..11 at step j
    assert only_response.counted == [20, 20, 20]
    assert [b - a for a, b in zip(only_response.counted, with_prompt.counted)] == [10, 9, 8]
    prompt_only = Sample("p", "test", sample.prompt_ids, [])
    pid = torch.tensor(prompt_only.prompt_ids)
    pfeats = objective.features.get(pid.tolist())
    loss0, none = ttt_loss(objective.model, pid, len(pid), pfeats, 3, 0.8, objective.t2d_index)
    loss, some = ttt_loss(objective.model, pid, len(pid), pfeats, 3, 0.8, objective.t2d_index, score_prompt=True)
    assert sum(none.counted) == 0 and float(loss0) == 0.0
    assert some.counted == [10, 9, 8] and torch.isfinite(loss) and float(loss.detach()) > 0


def test_prompt_labels_are_the_targets_choice(zoo):
    """On a prompt the target itself wrote greedily, the prompt labels equal the text: same accuracy."""
    target = zoo.load("bigram")
    (sample,) = greedy_samples(target, 1, prompt_len=4, response_len=30)
    objective = _objective(target, [sample])
    ids = torch.tensor([*sample.prompt_ids, *sample.response_ids])
    feats = objective.features.get(ids.tolist())
    as_response = ttt_loss(objective.model, ids, 4, feats, 2, 0.8, objective.t2d_index)[1]
    moved = ttt_loss(objective.model, ids, 20, feats, 2, 0.8, objective.t2d_index, score_prompt=True)[1]
    as_prompt = ttt_loss(objective.model, ids, 4, feats, 2, 0.8, objective.t2d_index, score_prompt=True)[1]
    assert moved.correct == as_prompt.correct and moved.counted == as_prompt.counted
    assert as_prompt.counted[0] == as_response.counted[0] + 2  # prompt tokens 2 and 3


def test_prompt_only_samples_never_validate(zoo, tmp_path):
    target = zoo.load("bigram")
    generated = greedy_samples(target, 12, response_len=16)
    prompts = [Sample(f"p{i}", "test", s.prompt_ids, []) for i, s in enumerate(generated)]
    objective = _objective(target, generated, score_prompt=True)
    settings = TrainSettings(max_steps=2, tokens_per_step=128, val_fraction=0.5, warmup_steps=1)
    report = train(objective, generated + prompts, tmp_path / "run", settings, progress=False)
    assert report["train_samples"] == 12 + len(generated) - report["validation"]["samples"]
    data = report["data"]
    assert data["prompt_only_samples"] == 12 and data["held_out_samples"] == report["validation"]["samples"]
    assert data["generated_samples"] == 12 - data["held_out_samples"] == data["generated_kinds"]["test"]
    assert data["response_tokens"] == 16 * data["generated_samples"]
    assert 0 < report["validation"]["samples"] < 12


def test_prompt_only_samples_skip_done_and_long_prompts(zoo, monkeypatch):
    target = zoo.load("bigram")
    fake = [TrainPrompt(f"id{i}", "chat", ("word " * (3 + 40 * (i == 2)),)) for i in range(6)]
    monkeypatch.setattr(prompt_samples, "build_prompts", lambda *a, **k: list(fake))
    short = len(render_prompt(target.tokenizer, fake[0].turns, ()))
    long = len(render_prompt(target.tokenizer, fake[2].turns, ()))
    assert short < long
    out = prompt_samples.prompt_only_samples(target.tokenizer, {"id0"}, max_tokens=short)
    assert sorted(s.id for s in out) == ["id1", "id3", "id4", "id5"]
    assert all(s.response_ids == [] and len(s.prompt_ids) == short for s in out)
    assert len(prompt_samples.prompt_only_samples(target.tokenizer, set(), short, limit=2)) == 2


def test_init_from_starts_from_the_drafters_weights_and_vocab(zoo, tmp_path, capsys):
    target = zoo.load("bigram")
    start = make_random_eagle3(target, tmp_path / "start", draft_vocab_size=200, seed=3)
    objective = _objective(target, greedy_samples(target, 2), init_from=tmp_path / "start")
    loaded, _ = load_eagle3(start, target)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(objective.model.state_dict()[name].to(tensor.dtype), tensor), name
    assert objective.model.config.draft_vocab_size == 200
    data = write_data_dir(tmp_path / "data", greedy_samples(target, 6))
    rc = main(["train", "eagle3", "--target", zoo.path("bigram"), "--data", str(data), "--output",
               str(tmp_path / "tuned"), "--init-from", start, "--max-steps", "2", "--tokens-per-step", "128",
               "--val-fraction", "0"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["steps"] == 2
    tuned = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert tuned["draft_vocab_size"] == 200


@pytest.mark.parametrize("method", ["eagle3", "medusa", "mtp", "dflash"])
def test_train_command_adds_prompt_only_samples(zoo, tmp_path, monkeypatch, capsys, method):
    target = zoo.load("bigram")
    fake = [TrainPrompt(f"fake{i}", "chat", (f"word {i} " * 4,)) for i in range(5)]
    monkeypatch.setattr(prompt_samples, "build_prompts", lambda *a, **k: list(fake))
    data = write_data_dir(tmp_path / "data", greedy_samples(target, 4))
    rc = main(["train", method, "--target", zoo.path("bigram"), "--data", str(data), "--output",
               str(tmp_path / method), "--prompt-samples", "3", "--max-steps", "2", "--tokens-per-step", "64",
               "--val-fraction", "0", "--draft-vocab-size", "128"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["train_samples"] == 4 + 3


@pytest.mark.parametrize("method", ["medusa", "mtp"])
def test_medusa_and_mtp_score_prompt_positions(zoo, method):
    from specdec.training.train_medusa import MedusaObjective, MedusaTrainOptions
    from specdec.training.train_mtp import MTPObjective, MTPTrainOptions

    target = zoo.load("bigram")
    (sample,) = greedy_samples(target, 1, prompt_len=10, response_len=12)
    prompt_only = Sample("p", "test", [*sample.prompt_ids, *sample.response_ids], [])
    counts = {}
    for score in (False, True):
        if method == "medusa":
            objective = MedusaObjective(target, [sample], MedusaTrainOptions(draft_vocab_size=128, num_heads=2,
                                                                              score_prompt=score), None, 0)
        else:
            objective = MTPObjective(target, [sample], MTPTrainOptions(draft_vocab_size=128, steps=2,
                                                                        score_prompt=score), None, 0)
        objective.model.train()
        counts[score] = (objective.loss(sample)[1].counted, objective.loss(prompt_only)[1].counted)
    (resp, none), (resp_p, some) = counts[False], counts[True]
    # head k (Medusa, from 0) predicts token i + 2 + k, depth k (MTP, from 1) token i + k + 1: the prompt's
    # 10 tokens add labels 2..9 to the first and 3..9 to the second; a 22-token prompt-only sample, 20 and 19
    assert sum(none) == 0 and some == [20, 19]
    assert [b - a for a, b in zip(resp, resp_p)] == [8, 7]


def test_dflash_anchors_and_labels_in_the_prompt(zoo):
    from specdec.training.dflash_objective import dflash_loss, sample_anchors
    from specdec.training.train_dflash import DFlashObjective, DFlashTrainOptions

    target = zoo.load("bigram")
    (sample,) = greedy_samples(target, 1, prompt_len=10, response_len=12)
    assert sample_anchors(1, 22, 100, None).tolist() == list(range(1, 21))
    objective = DFlashObjective(target, [sample], DFlashTrainOptions(block_size=4, num_layers=1,
                                                                       draft_vocab_size=128), None, 0)
    ids = torch.tensor([*sample.prompt_ids, *sample.response_ids])
    feats = objective.features.get(ids.tolist())
    anchors = torch.tensor([2, 5])  # slots 1..3 on prompt tokens 3..5 and 6..8
    _, m = dflash_loss(objective.model, ids, feats, anchors, objective.t2d_index, 4.0, prompt_len=10)
    assert m.counted[0] == 2  # every prompt slot is labelled (the target's choice), none dropped as OOV
    # without a prompt length the same slots are labelled with the prompt's own tokens, some outside the
    # 128-token draft vocabulary: fewer (or as many) are scored, never more
    _, plain = dflash_loss(objective.model, ids, feats, anchors, objective.t2d_index, 4.0)
    assert plain.counted[0] <= m.counted[0]
