"""Medusa heads with their own vocabulary projections (Medusa-1, FasterDecoding, vLLM): format, FasterDecoding
checkpoints, training from the target's rows, losslessness."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from specdec import LLM
from specdec.drafting.medusa_format import load_medusa
from specdec.drafting.medusa_vllm import write_vllm_medusa
from specdec.training.train_medusa import MedusaTrainOptions, train_medusa
from specdec.training.trainer import TrainSettings

from eagle3_helpers import greedy_samples
from medusa_helpers import make_random_medusa
from test_medusa import _same_greedy


def _faster_decoding_folder(folder, hidden: int, vocab: int, num_heads: int = 2, num_layers: int = 1,
                            suffix: str = ".pt", seed: int = 0) -> dict[str, torch.Tensor]:
    """A FasterDecoding-style checkpoint: `{head}.{layer}.linear.*` ResBlocks and `{head}.{num_layers}.weight`."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for h in range(num_heads):
        for j in range(num_layers):
            state[f"{h}.{j}.linear.weight"] = torch.randn(hidden, hidden, generator=gen) * 0.3
            state[f"{h}.{j}.linear.bias"] = torch.randn(hidden, generator=gen) * 0.3
        state[f"{h}.{num_layers}.weight"] = torch.randn(vocab, hidden, generator=gen)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
                                                   "base_model_name_or_path": "some/base"}))
    if suffix == ".pt":
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        save_file(state, str(folder / "medusa_lm_head.safetensors"))
    return state


def test_own_heads_round_trip(zoo, tmp_path):
    target = zoo.load("llama")
    path = make_random_medusa(target, tmp_path / "d", draft_vocab_size=100, num_heads=3, num_layers=2, own_lm_heads=True)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["specdec"]["shares_target_lm_head"] is False
    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert all(saved[f"medusa_head.{k}.2.weight"].shape == (100, target.decoder.arch.hidden_size) for k in range(3))
    heads, _ = load_medusa(path, target)
    assert heads.config.own_lm_heads and set(saved) == set(heads.state_dict())
    heads.attach_target(target.decoder.head_weight())
    hidden = torch.randn(2, target.decoder.arch.hidden_size)
    heads = heads.float()
    with torch.no_grad():
        expected = torch.stack([heads.head_state(k, hidden) @ saved[f"medusa_head.{k}.2.weight"].float().T
                                for k in range(3)])
        torch.testing.assert_close(heads.all_logits(hidden), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("tree", [{}, {"tree_top_k": 3, "tree_num_draft_tokens": 10}])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_own_heads_greedy_equals_plain_decoding(zoo, tmp_path, family, tree):
    target = zoo.load(family)
    path = make_random_medusa(target, tmp_path / "d", draft_vocab_size=150, own_lm_heads=True)
    _same_greedy(target, {"method": "medusa", "model": path, **tree})


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_faster_decoding_checkpoint_drafts_its_heads_argmax(zoo, tmp_path, suffix):
    target = zoo.load("llama")
    hidden_size, vocab = target.decoder.arch.hidden_size, target.vocab_size
    state = _faster_decoding_folder(tmp_path / "fd", hidden_size, vocab, suffix=suffix)
    spec = _same_greedy(target, {"method": "medusa", "model": str(tmp_path / "fd"), "tree_top_k": 1})
    proposer = spec.proposer
    assert proposer.heads.config.own_lm_heads and proposer.heads.config.draft_vocab_size == vocab
    h = torch.randn(1, hidden_size).to(target.dtype)
    proposer.hidden = h
    proposer.vocab.reset()
    draft = proposer.propose([1, 2, 3], max_tokens=4)
    checked = 0
    for k in range(2):  # ResBlock then the head's own projection, computed by hand
        w, b = state[f"{k}.0.linear.weight"], state[f"{k}.0.linear.bias"]
        x = h.float() + torch.nn.functional.silu(h.float() @ w.T + b)
        logits = x @ state[f"{k}.1.weight"].T
        top2 = logits[0].topk(2)
        if top2.values[0] - top2.values[1] > 0.5:  # far from a bfloat16 tie
            assert draft.tokens[k] == int(top2.indices[0])
            checked += 1
    assert checked, "no head's argmax was clear of a bfloat16 tie: nothing was compared"


def test_faster_decoding_checkpoint_problems_are_clear_errors(zoo, tmp_path):
    target = zoo.load("llama")
    hidden_size = target.decoder.arch.hidden_size
    _faster_decoding_folder(tmp_path / "vocab", hidden_size, target.vocab_size + 5)
    with pytest.raises(ValueError, match="the target has hidden size"):
        LLM(loaded=target, speculative_config={"method": "medusa", "model": str(tmp_path / "vocab")})
    state = _faster_decoding_folder(tmp_path / "heads", hidden_size, target.vocab_size, num_heads=3)
    del state["2.1.weight"]
    torch.save(state, tmp_path / "heads" / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="needs its projection"):
        LLM(loaded=target, speculative_config={"method": "medusa", "model": str(tmp_path / "heads")})


def test_own_heads_start_as_the_target_and_train(zoo, tmp_path):
    """Own projections grown from shared heads start exactly as them (the target's rows), then learn."""
    target = zoo.load("bigram")
    settings = TrainSettings(max_steps=40, tokens_per_step=256, lr=1e-2, warmup_steps=5, val_fraction=0.1,
                             checkpoint_every=20)
    samples = greedy_samples(target, 48)
    shared = tmp_path / "shared"
    train_medusa(target, samples, shared, settings, MedusaTrainOptions(draft_vocab_size=256, num_heads=2), progress=False)
    own = tmp_path / "own"
    start = TrainSettings(max_steps=1, tokens_per_step=256, lr=0.0, warmup_steps=0, val_fraction=0.1,
                          checkpoint_every=20)
    train_medusa(target, samples, own, start, MedusaTrainOptions(init_from=shared, own_lm_heads=True), progress=False)
    a, _ = load_medusa(shared, target)
    b, _ = load_medusa(own, target)
    assert b.config.own_lm_heads and not a.config.own_lm_heads
    for heads in (a, b):  # as the proposer holds them: in the target's dtype
        heads.to(target.dtype).attach_target(target.decoder.head_weight())
    h = torch.randn(3, target.decoder.arch.hidden_size).to(target.dtype)
    with torch.no_grad():
        torch.testing.assert_close(b.all_logits(h), a.all_logits(h))
    trained = tmp_path / "trained"
    report = train_medusa(target, samples, trained, settings, MedusaTrainOptions(init_from=own), progress=False)
    assert report["validation"]["step_accuracy"][0] > 0.5
    with pytest.raises(ValueError, match="cannot drop them"):
        train_medusa(target, samples, tmp_path / "x", settings,
                     MedusaTrainOptions(init_from=own, own_lm_heads=False), progress=False)
    with pytest.raises(ValueError, match="shrink-vocab"):
        train_medusa(target, samples, tmp_path / "y", settings,
                     MedusaTrainOptions(init_from=own, draft_vocab_size=100), progress=False)


def _vllm_folder(folder, hidden: int, vocab: int, token_map: torch.Tensor | None, shared_head: bool,
                 num_heads: int = 2, seed: int = 1) -> dict[str, torch.Tensor]:
    """A checkpoint in vLLM's Medusa layout: blocks.{h}.layers.{l}.weight (no bias), lm_heads, token_map."""
    gen = torch.Generator().manual_seed(seed)
    rows = vocab if token_map is None else token_map.numel()
    state = {f"blocks.{h}.layers.0.weight": torch.randn(hidden, hidden, generator=gen) * 0.3 for h in range(num_heads)}
    for h in range(1 if shared_head else num_heads):
        state[f"lm_heads.{h}.weight"] = torch.randn(rows, hidden, generator=gen)
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": hidden, "vocab_size": vocab,
              "num_heads": num_heads, "num_hidden_layers": 1, "truncated_vocab_size": rows,
              "original_lm_head": shared_head}
    if token_map is not None:
        state["token_map"] = token_map
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({f"medusa_heads.{k}": v for k, v in state.items()}, str(folder / "model.safetensors"))
    return state


@pytest.mark.parametrize("truncated,shared", [(False, False), (True, True)])
def test_vllm_checkpoint_drafts_its_heads_argmax(zoo, tmp_path, truncated, shared):
    target = zoo.load("llama")
    hidden_size, vocab = target.decoder.arch.hidden_size, target.vocab_size
    token_map = torch.randperm(vocab, generator=torch.Generator().manual_seed(5))[:64] if truncated else None
    state = _vllm_folder(tmp_path / "v", hidden_size, vocab, token_map, shared)
    spec = _same_greedy(target, {"method": "medusa", "model": str(tmp_path / "v"), "tree_top_k": 1})
    proposer = spec.proposer
    assert proposer.heads.config.draft_vocab_size == (64 if truncated else vocab)
    h = torch.randn(1, hidden_size).to(target.dtype)
    proposer.hidden = h
    proposer.vocab.reset()  # no context tokens: the draft vocabulary only
    draft = proposer.propose([], max_tokens=4)
    checked = 0
    for k in range(2):
        x = h.float() + torch.nn.functional.silu(h.float() @ state[f"blocks.{k}.layers.0.weight"].T)
        logits = x @ state[f"lm_heads.{0 if shared else k}.weight"].T
        top2 = logits[0].topk(2)
        if top2.values[0] - top2.values[1] > 0.5:  # far from a bfloat16 tie
            best = int(top2.indices[0])
            assert draft.tokens[k] == (int(token_map[best]) if truncated else best)
            checked += 1
    assert checked, "no head's argmax was clear of a bfloat16 tie: nothing was compared"


def test_vllm_checkpoint_problems_are_clear_errors(zoo, tmp_path):
    target = zoo.load("llama")
    hidden_size, vocab = target.decoder.arch.hidden_size, target.vocab_size
    _vllm_folder(tmp_path / "noheads", hidden_size, vocab, None, shared_head=False)
    cfg = json.loads((tmp_path / "noheads" / "config.json").read_text())
    (tmp_path / "noheads" / "config.json").write_text(json.dumps({**cfg, "num_heads": 3}))
    with pytest.raises(ValueError, match="no weight for blocks.2"):
        LLM(loaded=target, speculative_config={"method": "medusa", "model": str(tmp_path / "noheads")})
    _vllm_folder(tmp_path / "scale", hidden_size, vocab, None, shared_head=False)
    (tmp_path / "scale" / "config.json").write_text(json.dumps({**cfg, "logit_scale": 2.0}))
    with pytest.raises(ValueError, match="logit_scale"):
        LLM(loaded=target, speculative_config={"method": "medusa", "model": str(tmp_path / "scale")})


@pytest.mark.parametrize("own", [False, True])
def test_export_to_vllm_layout_round_trips(zoo, tmp_path, own):
    """Our heads written in vLLM's layout (shared rows stored once as original_lm_head, the draft vocabulary
    as token_map) read back as the same heads."""
    target = zoo.load("llama")
    path = make_random_medusa(target, tmp_path / "d", draft_vocab_size=120, own_lm_heads=own)
    heads, _ = load_medusa(path, target)
    heads = heads.to(target.dtype)
    heads.attach_target(target.decoder.head_weight())
    config = write_vllm_medusa(tmp_path / "v", heads, token_map=True, dtype=target.dtype)
    assert config["original_lm_head"] is not own and config["truncated_vocab_size"] == 120
    saved = load_file(str(tmp_path / "v" / "model.safetensors"))
    assert ("lm_heads.1.weight" in saved) is own and saved["token_map"].tolist() == heads.draft_ids().tolist()
    back, _ = load_medusa(tmp_path / "v", target)
    back = back.to(target.dtype)
    back.attach_target(target.decoder.head_weight())
    assert back.draft_ids().tolist() == heads.draft_ids().tolist()
    h = torch.randn(3, target.decoder.arch.hidden_size).to(target.dtype)
    with torch.no_grad():
        torch.testing.assert_close(back.all_logits(h), heads.all_logits(h))
    _same_greedy(target, {"method": "medusa", "model": str(tmp_path / "v")})
