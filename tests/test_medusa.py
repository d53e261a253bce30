"""Medusa: static trees, drafts that follow the heads' ranks, training, format, losslessness, acceptance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from specdec import LLM, SamplingParams
from specdec.drafting.medusa_format import load_medusa
from specdec.drafting.tree import tree_depths
from specdec.drafting.medusa_model import (
    choice_problems,
    expected_accepted,
    prior_accuracy,
    sort_paths,
    tree_from_accuracy,
    tree_parents,
)
from specdec.training.train_medusa import MedusaTrainOptions, train_medusa
from specdec.training.trainer import TrainSettings

from eagle3_helpers import greedy_samples
from medusa_helpers import make_random_medusa
from stat_helpers import assert_first_tokens_follow_the_target
from test_engine import NUM_SAMPLES, SAMPLING_CASES, exact_first_tokens, small_prompt  # noqa: F401 (fixtures)

PROMPTS = ["The quick brown fox", "Once upon a time, in a land", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def _same_greedy(target, config, prompts=PROMPTS) -> LLM:
    plain, spec = LLM(loaded=target), LLM(loaded=target, speculative_config=config)
    for prompt in prompts:
        assert spec.generate(prompt, GREEDY)[0].outputs[0].token_ids == plain.generate(prompt, GREEDY)[0].outputs[0].token_ids
    return spec


def test_tree_from_accuracy_keeps_the_likeliest_paths():
    acc = [[0.8, 0.1], [0.5, 0.3], [0.9, 0.05]]
    paths = tree_from_accuracy(acc, 4)
    # path probabilities: (0,) .8, (0,0) .4, (0,0,0) .36, (0,1) .24, (1,) .1
    assert paths == [(0,), (0, 0), (0, 1), (0, 0, 0)]
    assert tree_parents(paths) == [-1, 0, 0, 1]
    assert tree_from_accuracy(acc, 10, max_depth=1) == [(0,), (1,)]
    assert expected_accepted(acc, paths) == pytest.approx(1 + 0.8 + 0.4 + 0.24 + 0.36)
    assert len(tree_from_accuracy(prior_accuracy(4), 24)) == 24


def test_choice_problems():
    assert choice_problems([[0], [0, 1], [1]]) == []
    assert "parent" in choice_problems([[0], [1, 0]])[0]
    assert "deeper" in choice_problems([[0], [0, 0], [0, 0, 0]], num_heads=2)[0]
    assert choice_problems([])
    assert sort_paths([[1], [0, 0], [0]]) == [(0,), (1,), (0, 0)]


def test_drafts_follow_the_head_ranks(zoo, tmp_path):
    target = zoo.load("llama")
    path = make_random_medusa(target, tmp_path / "d", draft_vocab_size=150, num_heads=3)
    choices = [[0], [1], [0, 0], [0, 2], [1, 0], [0, 0, 0]]
    llm = LLM(loaded=target, speculative_config={"method": "medusa", "model": path, "medusa_choices": choices})
    proposer = llm.proposer
    hidden = torch.randn(1, target.decoder.arch.hidden_size).to(target.dtype)
    proposer.hidden = hidden
    draft = proposer.propose([1, 2, 3], max_tokens=8)
    heads = proposer.heads
    top = heads.all_logits(hidden)[:, 0].topk(3, dim=-1).indices
    paths = sort_paths(choices)
    assert draft.parents == tree_parents(paths) and draft.probs is None
    for node, p in zip(draft.tokens, paths):
        assert node == int(heads.draft_to_target(top[len(p) - 1, p[-1]]))
    assert len(proposer.propose([1, 2, 3], max_tokens=2).tokens) == 5  # depth 3 left out


def test_grown_tree_follows_the_head_probabilities(zoo, tmp_path):
    """tree_top_k grows the tree from the heads' own distributions: with top-k 1 it is the chain of each
    head's argmax; wider, every node is a path among the likeliest, siblings differ, and max_tokens caps depth."""
    target = zoo.load("llama")
    path = make_random_medusa(target, tmp_path / "d", draft_vocab_size=150, num_heads=3)
    hidden = torch.randn(1, target.decoder.arch.hidden_size).to(target.dtype)
    chain = LLM(loaded=target, speculative_config={"method": "medusa", "model": path, "tree_top_k": 1}).proposer
    chain.hidden = hidden
    argmax = chain.heads.all_logits(hidden)[:, 0].argmax(-1)
    draft = chain.propose([1, 2, 3], max_tokens=8)
    assert draft.parents == [-1, 0, 1]
    assert draft.tokens == [int(chain.heads.draft_to_target(t)) for t in argmax]
    tree = LLM(loaded=target, speculative_config={"method": "medusa", "model": path, "tree_top_k": 3,
                                                  "tree_num_draft_tokens": 7}).proposer
    tree.hidden = hidden
    draft = tree.propose([1, 2, 3], max_tokens=8)
    assert len(draft.tokens) == 7 and draft.parents[0] == -1
    assert draft.tokens[0] == int(tree.heads.draft_to_target(argmax[0]))  # the likeliest node comes first
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(draft.parents):
        assert parent < node
        children.setdefault(parent, []).append(draft.tokens[node])
    assert all(len(set(c)) == len(c) for c in children.values())
    assert max(tree_depths(tree.propose([1, 2, 3], max_tokens=1).parents)) == 1


def test_invalid_choices_are_a_clear_error(zoo, tmp_path):
    path = make_random_medusa(zoo.load("llama"), tmp_path / "d", num_heads=2)
    with pytest.raises(ValueError, match="needs its parent"):
        LLM(loaded=zoo.load("llama"), speculative_config={"method": "medusa", "model": path,
                                                         "medusa_choices": [[0], [1, 1]]})
    with pytest.raises(ValueError, match="deeper than the drafter's 2 heads"):
        LLM(loaded=zoo.load("llama"), speculative_config={"method": "medusa", "model": path,
                                                         "medusa_choices": [[0], [0, 0], [0, 0, 0]]})
    with pytest.raises(ValueError, match="give one or the other"):
        LLM(loaded=zoo.load("llama"), speculative_config={"method": "medusa", "model": path, "tree_top_k": 2,
                                                         "medusa_choices": [[0]]})
    with pytest.raises(ValueError, match="dynamic tree only"):
        LLM(loaded=zoo.load("llama"), speculative_config={"method": "medusa", "model": path,
                                                         "confidence_threshold": 0.2})


@pytest.mark.parametrize("tree", [{}, {"medusa_choices": [[0], [0, 0], [0, 0, 0]]}, {"tree_num_draft_tokens": 40},
                                  {"tree_top_k": 3, "tree_num_draft_tokens": 12, "confidence_threshold": 0.01}])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_greedy_equals_plain_decoding(zoo, tmp_path, family, tree):
    target = zoo.load(family)
    path = make_random_medusa(target, tmp_path / "d", draft_vocab_size=200)
    _same_greedy(target, {"method": "medusa", "model": path, **tree})


def test_save_load_round_trip(zoo, tmp_path):
    target = zoo.load("llama")
    path = make_random_medusa(target, tmp_path / "d", draft_vocab_size=100, seed=3, num_heads=4, num_layers=2)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["speculators_model_type"] == "medusa" and config["architectures"] == ["MedusaSpeculator"]
    assert config["medusa_num_heads"] == 4 and config["medusa_num_layers"] == 2 and config["draft_vocab_size"] == 100
    assert config["speculators_config"]["verifier"]["vocab_size"] == target.vocab_size
    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert not any("lm_head" in k or "embed" in k for k in saved)  # the target's LM head is shared
    heads, _ = load_medusa(path, target)
    assert set(saved) == set(heads.state_dict())
    for name, tensor in heads.state_dict().items():
        torch.testing.assert_close(tensor.to(saved[name].dtype), saved[name])
    # separate weights per head and per layer (the reference's `[ResBlock] * n` would share them)
    w = [heads.medusa_head[k][j].linear.weight for k in range(4) for j in range(2)]
    assert len({t.data_ptr() for t in w}) == 8 and not torch.equal(w[0], w[1])
    assert int(heads.t2d.sum()) == 100


def test_drafter_for_another_target_is_refused(zoo, tmp_path):
    path = make_random_medusa(zoo.load("llama"), tmp_path / "d")
    with pytest.raises(ValueError, match="trained for"):
        LLM(loaded=zoo.load("llama_draft"), speculative_config={"method": "medusa", "model": path})


@pytest.fixture(scope="module")
def trained_bigram_medusa(zoo, tmp_path_factory):
    """Heads trained briefly on the bigram target (next token = f(current token)): learnable in seconds."""
    target = zoo.load("bigram")
    out = tmp_path_factory.mktemp("bigram_medusa")
    settings = TrainSettings(max_steps=60, tokens_per_step=256, lr=1e-2, warmup_steps=5, val_fraction=0.1,
                             checkpoint_every=20)
    report = train_medusa(target, greedy_samples(target, 64), out, settings,
                          MedusaTrainOptions(draft_vocab_size=256, num_heads=3), progress=False)
    return out, report


def test_training_reduces_loss_and_writes_a_drafter(trained_bigram_medusa):
    out, report = trained_bigram_medusa
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 60
    first, last = np.mean([r["loss"] for r in log[:5]]), np.mean([r["loss"] for r in log[-5:]])
    assert last < 0.5 * first, (first, last)
    assert report["validation"]["step_accuracy"][0] > 0.5
    config = json.loads((out / "config.json").read_text())
    accuracy = config["specdec"]["head_rank_accuracy"]  # what the default tree is built from
    assert len(accuracy) == 3 and len(accuracy[0]) == 10 and accuracy[0][0] > 0.5


def test_trained_heads_are_accepted(zoo, trained_bigram_medusa, tmp_path):
    """Acceptance regression: a hidden-state/position misalignment would bring trained heads down to
    untrained ones' acceptance while the outputs stay right."""
    out, _ = trained_bigram_medusa
    target = zoo.load("bigram")
    untrained = make_random_medusa(target, tmp_path / "random", draft_vocab_size=256)
    prompts = [{"prompt_token_ids": s.prompt_ids} for s in greedy_samples(target, 4, seed=9)]  # unseen
    for extra in ({}, {"medusa_choices": [[0], [0, 0], [0, 0, 0]]}, {"tree_top_k": 2, "tree_num_draft_tokens": 8}):
        rates = {}
        for name, path in (("trained", str(out)), ("untrained", untrained)):
            spec = _same_greedy(target, {"method": "medusa", "model": path, **extra}, prompts)
            rates[name] = spec.stats.mean_acceptance_length
        assert rates["trained"] > 1.8 and rates["trained"] - 1 > 3 * (rates["untrained"] - 1), (extra, rates)


@pytest.fixture(scope="module")
def small_vocab_medusa(zoo, tmp_path_factory):
    target = zoo.load("small_vocab")
    return make_random_medusa(target, tmp_path_factory.mktemp("sv_medusa") / "d", draft_vocab_size=10, seed=2)


@pytest.fixture(scope="module")
def small_vocab_medusa_own(zoo, tmp_path_factory):
    """Heads with their own vocabulary projections (Medusa-1's layout)."""
    target = zoo.load("small_vocab")
    return make_random_medusa(target, tmp_path_factory.mktemp("sv_medusa_own") / "d", draft_vocab_size=10, seed=4,
                              own_lm_heads=True)


SAMPLED_TREES = {"t1": {"medusa_choices": [[0], [1], [0, 0], [0, 1], [1, 0]]},
                 "warped": {"medusa_choices": [[0], [1], [0, 0], [0, 1], [1, 0]]},
                 "t1-grown": {"tree_top_k": 2, "tree_num_draft_tokens": 5},
                 "t1-own": {"medusa_choices": [[0], [1], [0, 0], [0, 1], [1, 0]]}}


@pytest.mark.parametrize("name", list(SAMPLED_TREES))
def test_sampling_distribution_matches_the_target(zoo, small_prompt, exact_first_tokens, request,  # noqa: F811
                                                  name):
    case = name.split("-")[0]
    drafter = request.getfixturevalue("small_vocab_medusa_own" if name.endswith("-own") else "small_vocab_medusa")
    config = {"method": "medusa", "model": drafter, **SAMPLED_TREES[name]}
    llm = LLM(loaded=zoo.load("small_vocab"), speculative_config=config)
    assert_first_tokens_follow_the_target(llm, small_prompt, NUM_SAMPLES, SAMPLING_CASES[case],
                                          exact_first_tokens[case])
    assert llm.stats.num_accepted_tokens >= 100, llm.stats.num_accepted_tokens
    assert llm.stats.acceptance_rate < 0.95
