"""EAGLE-3: TTT attention equals inference attention, trees, training, format, losslessness, acceptance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from specdec import LLM, SamplingParams
from specdec.drafting.dynamic_tree import TreeNode, grow_tree, select_subtree
from specdec.drafting.eagle3_format import load_eagle3
from specdec.drafting.eagle3_model import DraftKVCache, Eagle3Drafter
from specdec.training.eagle3_objective import default_aux_layers, default_eagle3_config
from specdec.training.features import FeatureExtractor
from specdec.training.train_eagle3 import Eagle3TrainOptions, train_eagle3
from specdec.training.trainer import TrainSettings, estimated_acceptance_length, split

from eagle3_helpers import greedy_samples, make_random_eagle3
from stat_helpers import assert_first_tokens_follow_the_target
from test_engine import NUM_SAMPLES, SAMPLING_CASES, exact_first_tokens, small_prompt  # noqa: F401 (fixtures)

PROMPTS = ["The quick brown fox", "Once upon a time, in a land", "def fibonacci(n):"]


def test_default_aux_layers_follow_eagle3():
    assert default_aux_layers(18) == [2, 9, 15]
    assert default_aux_layers(32) == [2, 16, 29]
    assert default_aux_layers(4) == [1, 2]  # tiny models: deduplicated, in range


def _drafter_and_fused_features(zoo):
    """A random EAGLE-3 drafter on the tiny llama, 20 random token ids and their fused target features."""
    target = zoo.load("llama", "float32")
    torch.manual_seed(0)
    drafter = Eagle3Drafter(default_eagle3_config(target, target.vocab_size)).eval()
    drafter.set_draft_vocab(torch.arange(target.vocab_size))
    dec = target.decoder
    drafter.attach_target(dec.embed.weight, dec.head_weight(), dec.arch.embed_scale or 1.0)
    ids = torch.randint(3, target.vocab_size, (20,), generator=torch.Generator().manual_seed(1))
    feats = FeatureExtractor(target, drafter.config.aux_layer_ids).compute(ids.tolist())
    fused = drafter.fuse(torch.cat([feats.hidden[i] for i in drafter.config.aux_layer_ids], -1).float())
    return drafter, ids, fused


def test_training_time_test_window_hides_exactly_the_keys_further_back(zoo):
    """`window` (the accuracy-by-position diagnostic's) masks step-0 keys more than `window` positions back:
    step 0 at index t equals inference over the last `window` committed positions only."""
    drafter, ids, fused = _drafter_and_fused_features(zoo)
    n, window = len(ids) - 1, 4
    with torch.no_grad():
        full = drafter.train_unrolled(fused[:n], ids[1 : 1 + n], torch.arange(n), [], [])
        wide = drafter.train_unrolled(fused[:n], ids[1 : 1 + n], torch.arange(n), [], [], window=n)
        narrow = drafter.train_unrolled(fused[:n], ids[1 : 1 + n], torch.arange(n), [], [], window=window)
        c = drafter.config
        cache = DraftKVCache(c.num_key_value_heads, c.head_dim, 64, torch.float32, torch.device("cpu"))
        visible = torch.ones(n, n, dtype=torch.bool).tril().triu(-(window - 1))
        alone = drafter.step(fused[:n], ids[1 : n + 1], torch.arange(n), cache, visible)
    torch.testing.assert_close(wide, full)
    torch.testing.assert_close(narrow, alone, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(narrow[window:], full[window:], atol=1e-3)  # it did hide something
    torch.testing.assert_close(narrow[:window], full[:window])


def test_training_time_test_attention_equals_chained_inference(zoo):
    """Step j of train_unrolled at index t must compute exactly what inference computes when it drafts
    j tokens after committing position t: an off-by-one here silently collapses acceptance."""
    drafter, ids, fused = _drafter_and_fused_features(zoo)
    steps, past_k, past_v, outs = 3, [], [], []
    with torch.no_grad():
        h = fused
        for j in range(steps):
            n = len(ids) - 1 - j
            h = drafter.train_unrolled(h[:n], ids[1 + j : 1 + j + n], torch.arange(j, j + n), past_k, past_v)
            outs.append(h)
        c = drafter.config
        for t in (0, 5, 12):
            cache = DraftKVCache(c.num_key_value_heads, c.head_dim, 64, torch.float32, torch.device("cpu"))
            n = t + 1  # commit positions 0..t
            visible = torch.ones(n, n, dtype=torch.bool).tril()
            h = drafter.step(fused[:n], ids[1 : n + 1], torch.arange(n), cache, visible)[-1:]
            torch.testing.assert_close(h, outs[0][t : t + 1], rtol=1e-4, atol=1e-4)
            for j in range(1, steps):  # chain: feed the next data token at position t + j
                visible = torch.ones(1, cache.length + 1, dtype=torch.bool)
                h = drafter.step(h, ids[t + 1 + j : t + 2 + j], torch.tensor([t + j]), cache, visible)
                torch.testing.assert_close(h, outs[j][t : t + 1], rtol=1e-4, atol=1e-4)


def test_select_subtree_keeps_topological_order_and_drops_orphans():
    nodes = [TreeNode(5, -1, -0.1, 1), TreeNode(6, -1, -2.0, 1), TreeNode(7, 0, -0.1, 2), TreeNode(8, 1, -2.0, 2)]
    kept = select_subtree(nodes, 3)  # node 3 ties node 1 at the cut: if node 1 is dropped, 3 must go too
    assert [n.token for n in kept][:3] == [5, 6, 7] or [n.token for n in kept] == [5, 7]
    for i, n in enumerate(kept):
        assert n.parent < i
    assert select_subtree(nodes, 2) == [TreeNode(5, -1, -0.1, 1), TreeNode(7, 0, -0.1, 2)]


def test_grow_tree_expands_the_best_frontier():
    vocab = 6
    table = torch.log_softmax(torch.arange(vocab, dtype=torch.float32) * 2.0, -1)  # token 5 most likely

    def expand(frontier, nodes):
        return table.expand(len(frontier), vocab).clone()

    nodes = grow_tree(table, expand, top_k=2, depth=3, total=5)
    assert len(nodes) == 5
    assert [n.token for n in nodes[:2]] == [5, 4]
    depths = [n.depth for n in nodes]
    assert max(depths) == 3 and all(nodes[n.parent].depth == n.depth - 1 for n in nodes if n.parent >= 0)


def test_save_load_round_trip_and_speculators_layout(zoo, tmp_path):
    target = zoo.load("llama")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=100, seed=3)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["draft_vocab_size"] == 100
    assert config["speculators_config"]["algorithm"] == "eagle3"
    assert config["speculators_config"]["default_proposal_method"] == "greedy"
    assert "transformer_layer_config" in config and config["speculators_config"]["verifier"]["vocab_size"] == target.vocab_size
    drafter, _ = load_eagle3(path, target)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert "lm_head.weight" not in saved and "embed_tokens.weight" not in saved  # shared with the target
    for name, tensor in drafter.state_dict().items():
        torch.testing.assert_close(tensor.to(saved[name].dtype), saved[name])
    assert int(drafter.t2d.sum()) == 100


def test_drafter_for_another_target_is_refused(zoo, tmp_path):
    path = make_random_eagle3(zoo.load("llama"), tmp_path / "d")
    with pytest.raises(ValueError, match="trained for"):
        LLM(loaded=zoo.load("llama_draft"), speculative_config={"method": "eagle3", "model": path})


def test_missing_drafter_is_a_clear_error(zoo, tmp_path):
    with pytest.raises(ValueError, match="drafter not found"):
        LLM(loaded=zoo.load("llama"), speculative_config={"method": "eagle3", "model": str(tmp_path / "nope")})


@pytest.mark.parametrize("tree", [None, dict(tree_top_k=3, tree_num_draft_tokens=10, num_speculative_tokens=4)])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_greedy_equals_plain_decoding(zoo, tmp_path, family, tree):
    target = zoo.load(family)
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    config = {"method": "eagle3", "model": path, "num_speculative_tokens": 3, **(tree or {})}
    plain, spec = LLM(loaded=target), LLM(loaded=target, speculative_config=config)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        assert spec.generate(prompt, params)[0].outputs[0].token_ids == plain.generate(prompt, params)[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def trained_bigram_drafter(zoo, tmp_path_factory):
    """A drafter trained briefly on the bigram target (next token = f(current token)): learnable in seconds."""
    target = zoo.load("bigram")
    samples = greedy_samples(target, 64)
    out = tmp_path_factory.mktemp("bigram_eagle3")
    settings = TrainSettings(max_steps=60, tokens_per_step=256, lr=1e-2, warmup_steps=5, val_fraction=0.1,
                             checkpoint_every=20)
    report = train_eagle3(target, samples, out, settings, Eagle3TrainOptions(draft_vocab_size=256, ttt_steps=3),
                          progress=False)
    return out, report


def test_training_reduces_loss_and_writes_a_drafter(trained_bigram_drafter):
    out, report = trained_bigram_drafter
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 60
    first, last = np.mean([r["loss"] for r in log[:5]]), np.mean([r["loss"] for r in log[-5:]])
    assert last < 0.5 * first, (first, last)
    assert report["validation"]["step_accuracy"][0] > 0.5  # about 0.7 after 60 steps
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_the_validation_walk_is_the_acceptance_decoding_measures(zoo, trained_bigram_drafter):
    """The report's greedy_walk_acceptance_length is what decoding the held-out responses measures with a
    chain as long as the trained steps (3), greedy."""
    out, report = trained_bigram_drafter
    target = zoo.load("bigram")
    _, val = split(greedy_samples(target, 64), 0.1)  # the fixture's held-out samples
    spec = LLM(loaded=target, speculative_config={"method": "eagle3", "model": str(out), "num_speculative_tokens": 3})
    for s in val:
        spec.generate({"prompt_token_ids": s.prompt_ids},
                      SamplingParams(temperature=0.0, max_tokens=len(s.response_ids), ignore_eos=True))
    walk, measured = report["validation"]["greedy_walk_acceptance_length"], spec.stats.mean_acceptance_length
    assert measured > 1.5 and abs(walk - measured) < 0.1 * measured, (walk, measured)


def test_trained_drafter_is_accepted_chain_and_tree(zoo, trained_bigram_drafter, tmp_path):
    """Acceptance regression: a feature/token misalignment at inference would bring the trained drafter
    down to an untrained one's acceptance while the outputs stay right."""
    out, _ = trained_bigram_drafter
    target = zoo.load("bigram")
    untrained = make_random_eagle3(target, tmp_path / "random", draft_vocab_size=256)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = [s.prompt_ids for s in greedy_samples(target, 4, seed=9)]  # unseen, same distribution
    plain = LLM(loaded=target)
    for extra in ({}, {"tree_top_k": 3, "tree_num_draft_tokens": 12}):
        rates = {}
        for name, path in (("trained", str(out)), ("untrained", untrained)):
            spec = LLM(loaded=target, speculative_config={"method": "eagle3", "model": path,
                                                          "num_speculative_tokens": 4, **extra})
            for prompt in prompts:
                want = plain.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids
                assert spec.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids == want
            rates[name] = spec.stats.mean_acceptance_length
        assert rates["trained"] > 1.8 and rates["trained"] - 1 > 3 * (rates["untrained"] - 1), (extra, rates)


def test_int8_drafter_weights_keep_the_trained_drafters_acceptance(zoo, trained_bigram_drafter):
    """The drafter's linears on int8 copies ("w8a8_int8") draft nearly as well as in bfloat16: a trained
    drafter's acceptance stays within a tenth, outputs identical (an int8 path that broke the drafter would
    fall to an untrained one's acceptance while the outputs stayed right)."""
    from specdec.quantization.kernel import quant_kernel

    if quant_kernel() is None:
        pytest.skip("the CPU int8 kernels (AVX2 and a compiler)")
    out, _ = trained_bigram_drafter
    target = zoo.load("bigram")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = [s.prompt_ids for s in greedy_samples(target, 4, seed=9)]
    rates, outputs = {}, {}
    for mode in ("none", "w8a8_int8"):
        spec = LLM(loaded=target, speculative_config={"method": "eagle3", "model": str(out),
                                                      "num_speculative_tokens": 4, "tree_top_k": 3,
                                                      "tree_num_draft_tokens": 12, "quantization": mode})
        assert (spec.new_proposer().drafter.int8 is not None) == (mode != "none")
        outputs[mode] = [spec.generate({"prompt_token_ids": p}, params)[0].outputs[0].token_ids for p in prompts]
        rates[mode] = spec.stats.mean_acceptance_length
    assert outputs["none"] == outputs["w8a8_int8"]
    assert rates["none"] > 1.8 and rates["w8a8_int8"] > 0.9 * rates["none"], rates


def test_resume_continues_where_it_stopped(zoo, tmp_path):
    target = zoo.load("bigram")
    samples = greedy_samples(target, 16, seed=1)
    opts = Eagle3TrainOptions(draft_vocab_size=256, ttt_steps=2)
    short = TrainSettings(max_steps=4, tokens_per_step=256, lr=1e-3, warmup_steps=2, checkpoint_every=2)
    train_eagle3(target, samples, tmp_path / "r", short, opts, progress=False)
    with pytest.raises(FileExistsError):
        train_eagle3(target, samples, tmp_path / "r", short, opts, progress=False)
    longer = TrainSettings(max_steps=8, tokens_per_step=256, lr=1e-3, warmup_steps=2, checkpoint_every=2)
    report = train_eagle3(target, samples, tmp_path / "r", longer, opts, resume=True, progress=False)
    assert report["steps"] == 8
    steps = [json.loads(line)["step"] for line in (tmp_path / "r" / "train_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))


def test_estimated_acceptance_length():
    assert estimated_acceptance_length([1.0, 1.0]) == 3.0
    assert estimated_acceptance_length([0.5, 0.5]) == pytest.approx(1.75)


@pytest.fixture(scope="module")
def small_vocab_drafter(zoo, tmp_path_factory):
    target = zoo.load("small_vocab")
    return make_random_eagle3(target, tmp_path_factory.mktemp("sv_eagle3") / "d", draft_vocab_size=10, seed=2)


@pytest.mark.parametrize(
    "case,shape",
    [("t1", "chain"), ("t1", "tree"), ("warped", "tree")],
)
def test_sampling_distribution_matches_the_target(zoo, small_prompt, exact_first_tokens, small_vocab_drafter,  # noqa: F811
                                                  case, shape):
    config = {"method": "eagle3", "model": small_vocab_drafter, "num_speculative_tokens": 3}
    if shape == "tree":
        config.update(tree_top_k=3, tree_num_draft_tokens=8)
    llm = LLM(loaded=zoo.load("small_vocab"), speculative_config=config)
    assert_first_tokens_follow_the_target(llm, small_prompt, NUM_SAMPLES, SAMPLING_CASES[case],
                                          exact_first_tokens[case])
    assert llm.stats.num_accepted_tokens >= 100, llm.stats.num_accepted_tokens
    assert llm.stats.acceptance_rate < 0.95


def test_a_long_prompt_is_read_in_chunks_with_the_same_drafts(zoo, trained_bigram_drafter, monkeypatch):
    """begin() reads the prompt in PROMPT_CHUNK pieces (a 30k-token prompt in one piece needs a 30k x 30k
    score matrix per head): the drafter's cache and drafts are the same as in one piece."""
    import specdec.drafting.eagle3 as eagle3

    out, _ = trained_bigram_drafter
    target = zoo.load("bigram")
    prompt = {"prompt_token_ids": [s for sample in greedy_samples(target, 3, seed=11) for s in sample.prompt_ids][:45]}
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    config = {"method": "eagle3", "model": str(out), "num_speculative_tokens": 4}
    runs = {}
    for chunk in (10_000, 7):
        monkeypatch.setattr(eagle3, "PROMPT_CHUNK", chunk)
        spec = LLM(loaded=target, speculative_config=config)
        tokens = spec.generate(prompt, params)[0].outputs[0].token_ids
        runs[chunk] = (tokens, spec.stats.num_draft_tokens, spec.stats.num_accepted_tokens)
    assert runs[7] == runs[10_000]
    assert runs[7][0] == LLM(loaded=target).generate(prompt, params)[0].outputs[0].token_ids


@pytest.mark.parametrize("window", [None, 5])
def test_ttt_loss_skipping_prompt_rows_changes_nothing(zoo, window):
    """Steps after the first skip the long prompt's indices no scored row needs: the same loss, accuracy and
    gradients as running every index at every step."""
    from specdec.training.eagle3_objective import ttt_loss

    target = zoo.load("llama", "float32")
    torch.manual_seed(0)
    drafter = Eagle3Drafter(default_eagle3_config(target, target.vocab_size))
    drafter.set_draft_vocab(torch.arange(target.vocab_size))
    dec = target.decoder
    drafter.attach_target(dec.embed.weight, dec.head_weight(), dec.arch.embed_scale or 1.0)
    ids = torch.randint(3, target.vocab_size, (40,), generator=torch.Generator().manual_seed(2))
    feats = FeatureExtractor(target, drafter.config.aux_layer_ids).compute(ids.tolist())
    index = drafter.target_to_draft()
    results = []
    for skip in (True, False):
        drafter.zero_grad()
        hits: list = []
        loss, m = ttt_loss(drafter, ids, 30, feats, 4, 0.8, index, window=window, hits=hits,
                           context_head=dec.head_weight(), skip_prompt_rows=skip)
        loss.backward()
        results.append((loss.detach(), m, [p.grad.clone() for p in drafter.parameters() if p.grad is not None], hits))
    (l1, m1, g1, h1), (l2, m2, g2, h2) = results
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-6)
    assert m1.correct == m2.correct and m1.counted == m2.counted and sum(m1.counted) > 0
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert [(j, p.tolist(), r.tolist()) for j, p, r in h1] == [(j, p.tolist(), r.tolist()) for j, p, r in h2]
