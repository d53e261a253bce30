"""`specdec train mtp|medusa --init-from DIR`: fine-tuning starts from a saved drafter's shape, weights and
vocabulary (or that vocabulary's most frequent part), and refuses what it cannot do."""

from __future__ import annotations

import json

import pytest
import torch
from specdec.cli import main
from specdec.drafting.medusa_format import load_medusa
from specdec.drafting.mtp_format import load_mtp
from specdec.training.train_medusa import MedusaObjective, MedusaTrainOptions
from specdec.training.train_mtp import MTPObjective, MTPTrainOptions

from eagle3_helpers import greedy_samples, write_data_dir
from medusa_helpers import make_random_medusa
from mtp_helpers import make_random_mtp

METHODS = {
    "mtp": (make_random_mtp, load_mtp, MTPObjective, MTPTrainOptions),
    "medusa": (make_random_medusa, load_medusa, MedusaObjective, MedusaTrainOptions),
}


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    b_state = b.state_dict()
    for name, tensor in a.state_dict().items():
        if name not in ("d2t", "t2d"):
            assert torch.equal(b_state[name].to(tensor.dtype), tensor), name


@pytest.mark.parametrize("method", METHODS)
def test_init_from_keeps_weights_and_shrinks_to_the_most_frequent_tokens(zoo, tmp_path, method):
    make, load, objective, options = METHODS[method]
    target = zoo.load("bigram")
    start_dir = make(target, tmp_path / "start", draft_vocab_size=200, seed=3)
    samples = greedy_samples(target, 4)
    start, _ = load(start_dir, target)
    same = objective(target, samples, options(init_from=start_dir), None, 0).model
    assert same.draft_ids().tolist() == start.draft_ids().tolist()
    _same_weights(start, same)
    small = objective(target, samples, options(draft_vocab_size=40, init_from=start_dir), None, 0).model
    assert small.draft_ids().numel() == 40
    assert set(small.draft_ids().tolist()) <= set(start.draft_ids().tolist())
    _same_weights(start, small)


@pytest.mark.parametrize("method", METHODS)
def test_init_from_refuses_a_larger_vocab_and_another_method(zoo, tmp_path, method):
    make, _, objective, options = METHODS[method]
    target = zoo.load("bigram")
    start_dir = make(target, tmp_path / "start", draft_vocab_size=100, seed=3)
    samples = greedy_samples(target, 2)
    with pytest.raises(ValueError, match="can only shrink"):
        objective(target, samples, options(draft_vocab_size=150, init_from=start_dir), None, 0)
    other_objective, other_options = next(v[2:] for m, v in METHODS.items() if m != method)
    with pytest.raises(ValueError, match=f"holds a '{method}' drafter"):
        other_objective(target, samples, other_options(init_from=start_dir), None, 0)


@pytest.mark.parametrize("method", METHODS)
def test_train_command_fine_tunes_from_a_drafter(zoo, tmp_path, capsys, method):
    make, load, _, _ = METHODS[method]
    target = zoo.load("bigram")
    start_dir = make(target, tmp_path / "start", draft_vocab_size=200, seed=3)
    data = write_data_dir(tmp_path / "data", greedy_samples(target, 6))
    rc = main(["train", method, "--target", zoo.path("bigram"), "--data", str(data), "--output",
               str(tmp_path / "tuned"), "--init-from", start_dir, "--draft-vocab-size", "64", "--max-steps", "2",
               "--tokens-per-step", "128", "--val-fraction", "0"])
    assert rc == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["draft_vocab_size"] == 64
    tuned, _ = load(tmp_path / "tuned", target)
    start, _ = load(start_dir, target)
    assert set(tuned.draft_ids().tolist()) <= set(start.draft_ids().tolist())
    changed = [n for n, t in start.state_dict().items()
               if n not in ("d2t", "t2d") and not torch.equal(tuned.state_dict()[n], t)]
    assert changed  # two optimizer steps moved the start's weights


@pytest.mark.parametrize("method,shape", [("mtp", {"num_modules": 2}), ("medusa", {"num_heads": 5})])
def test_init_from_refuses_a_different_shape(zoo, tmp_path, method, shape):
    make, _, objective, options = METHODS[method]
    target = zoo.load("bigram")
    start_dir = make(target, tmp_path / "start", draft_vocab_size=100, seed=3)
    with pytest.raises(ValueError, match="fixes the drafter's shape"):
        objective(target, greedy_samples(target, 2), options(init_from=start_dir, **shape), None, 0)


def test_medusa_init_from_grows_deeper_heads_that_start_as_the_saved_ones(zoo, tmp_path):
    target = zoo.load("bigram")
    start_dir = make_random_medusa(target, tmp_path / "start", draft_vocab_size=100, seed=3, num_layers=1)
    samples = greedy_samples(target, 2)
    start, _ = load_medusa(start_dir, target)
    deeper = MedusaObjective(target, samples, MedusaTrainOptions(init_from=start_dir, num_layers=3), None, 0).model
    assert deeper.config.num_layers == 3
    h = torch.randn(5, start.config.hidden_size)
    for k in range(start.config.num_heads):  # the added ResBlocks are the identity until trained
        assert torch.equal(deeper.head_state(k, h), start.head_state(k, h))
    with pytest.raises(ValueError, match="can only grow"):
        two = make_random_medusa(target, tmp_path / "two", draft_vocab_size=100, seed=3, num_layers=2)
        MedusaObjective(target, samples, MedusaTrainOptions(init_from=two, num_layers=1), None, 0)
