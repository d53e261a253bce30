"""Shrinking a trained EAGLE-3 drafter's draft vocabulary (`--init-from` with a smaller `--draft-vocab-size`)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from specdec.cli import main
from specdec.drafting.eagle3_format import load_eagle3
from specdec.training.draft_vocab import frequent_tokens
from specdec.training.train_eagle3 import Eagle3Objective, Eagle3TrainOptions

from eagle3_helpers import greedy_samples, make_random_eagle3, write_data_dir


def test_frequent_tokens_within_a_set_ranks_only_its_members():
    within = torch.tensor([2, 5, 7, 9, 11])
    responses = [[7, 7, 7, 3, 3, 3, 3, 9, 9]]  # 3 is the most frequent but not a member
    ids = frequent_tokens(responses, 3, 20, fallback=[[11, 11]], within=within)
    assert ids.tolist() == [7, 9, 11]
    assert frequent_tokens(responses, 4, 20, within=within).tolist() == [2, 5, 7, 9]  # then the lowest ids
    with pytest.raises(ValueError, match="1..5"):
        frequent_tokens(responses, 6, 20, within=within)


def test_shrunk_drafter_keeps_weights_and_its_most_frequent_tokens(zoo, tmp_path):
    target = zoo.load("bigram")
    start_dir = make_random_eagle3(target, tmp_path / "start", draft_vocab_size=200, seed=3)
    samples = greedy_samples(target, 4)
    shrunk = Eagle3Objective(target, samples, Eagle3TrainOptions(draft_vocab_size=50, init_from=start_dir),
                             None, 0).model
    start, _ = load_eagle3(start_dir, target)
    assert shrunk.config.draft_vocab_size == 50
    kept = set(shrunk.draft_ids().tolist())
    assert kept <= set(start.draft_ids().tolist())
    counts = Counter(t for s in samples for t in s.response_ids if t in set(start.draft_ids().tolist()))
    top = {t for t, _ in counts.most_common() if counts[t] > min(counts[k] for k in kept if k in counts)}
    assert top <= kept  # every member more frequent than the rarest kept one is kept
    for name, tensor in start.state_dict().items():
        if name not in ("d2t", "t2d"):
            assert torch.equal(shrunk.state_dict()[name].to(tensor.dtype), tensor), name
    # the same token keeps the same logit: the head rows are the target's, the weights unchanged
    decoder = target.decoder
    for drafter in (start.float(), shrunk.float()):
        drafter.attach_target(decoder.embed.weight.float(), decoder.head_weight().float(), decoder.arch.embed_scale or 1.0)
    h = torch.randn(3, start.config.hidden_size)
    with torch.no_grad():
        big = dict(zip(start.draft_ids().tolist(), start.draft_logits(h)[0].tolist()))
        small = shrunk.draft_logits(h)[0].tolist()
    for token, logit in zip(shrunk.draft_ids().tolist(), small):
        assert logit == pytest.approx(big[token], rel=1e-3, abs=1e-3)


def test_vocab_cannot_grow_when_fine_tuning(zoo, tmp_path):
    target = zoo.load("bigram")
    start_dir = make_random_eagle3(target, tmp_path / "start", draft_vocab_size=100, seed=3)
    with pytest.raises(ValueError, match="can only shrink"):
        Eagle3Objective(target, greedy_samples(target, 2), Eagle3TrainOptions(draft_vocab_size=150, init_from=start_dir),
                        None, 0)


def test_train_command_shrinks_the_vocab(zoo, tmp_path, capsys):
    target = zoo.load("bigram")
    start = make_random_eagle3(target, tmp_path / "start", draft_vocab_size=200, seed=3)
    data = write_data_dir(tmp_path / "data", greedy_samples(target, 6))
    rc = main(["train", "eagle3", "--target", zoo.path("bigram"), "--data", str(data), "--output",
               str(tmp_path / "small"), "--init-from", start, "--draft-vocab-size", "64", "--max-steps", "1",
               "--tokens-per-step", "128", "--val-fraction", "0"])
    assert rc == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "small" / "config.json").read_text())["draft_vocab_size"] == 64
    loaded, _ = load_eagle3(tmp_path / "small", target)
    assert loaded.draft_ids().numel() == 64
