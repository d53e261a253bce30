"""DFlash: attention masks of training and inference, training forward equals inference forward, the
context cache, format, training, losslessness (greedy and sampling) and acceptance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from specdec import LLM, SamplingParams
from specdec.drafting.dflash import DFlashOptions, DFlashProposer
from specdec.drafting.dflash_format import load_dflash, save_dflash
from specdec.drafting.dflash_model import (
    ContextCache,
    DFlashDrafter,
    attend,
    context_visibility,
    training_attention_mask,
)
from specdec.training.dflash_objective import (
    default_dflash_config,
    default_target_layer_ids,
    dflash_loss,
    position_weights,
    sample_anchors,
)
from specdec.training.eagle3_objective import default_aux_layers
from specdec.training.features import FeatureExtractor
from specdec.training.train_dflash import DFlashTrainOptions, train_dflash
from specdec.training.trainer import TrainSettings, split

from eagle3_helpers import greedy_samples
from stat_helpers import assert_first_tokens_follow_the_target
from test_engine import NUM_SAMPLES, SAMPLING_CASES, exact_first_tokens, small_prompt  # noqa: F401 (fixtures)

PROMPTS = ["The quick brown fox", "Once upon a time, in a land", "def fibonacci(n):"]


def make_random_dflash(target, folder, draft_vocab_size=None, block_size=8, seed=0) -> str:
    vocab = target.vocab_size
    size = draft_vocab_size or vocab
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:size].sort().values
    torch.manual_seed(seed)
    drafter = DFlashDrafter(default_dflash_config(target, size, block_size=block_size, num_layers=2))
    drafter.set_draft_vocab(ids)
    save_dflash(folder, drafter.to(target.dtype), target)
    return str(folder)


def attached(target, block_size=8, num_layers=2, seed=0) -> DFlashDrafter:
    torch.manual_seed(seed)
    drafter = DFlashDrafter(default_dflash_config(target, target.vocab_size, block_size, num_layers)).eval()
    drafter.set_draft_vocab(torch.arange(target.vocab_size))
    dec = target.decoder
    drafter.attach_target(dec.embed.weight, dec.head_weight(), dec.arch.embed_scale or 1.0)
    return drafter


# -- layer choice --------------------------------------------------------------------------------------------
def test_default_target_layers_are_outputs_shared_with_eagle3():
    assert default_target_layer_ids(18) == [1, 8, 14]  # Gemma 3 270M: runtime hidden[2], hidden[9], hidden[15]
    for layers in (18, 24, 32):  # the same tensors EAGLE-3 reads, so one feature cache serves both
        assert [i + 1 for i in default_target_layer_ids(layers)] == default_aux_layers(layers)
    assert default_target_layer_ids(36, count=5) == [1, 9, 17, 25, 33]  # DFlash's Qwen3-8B choice
    assert default_target_layer_ids(4) == [0, 1]


def test_loss_weights_decay_with_the_block_position():
    w = position_weights(8, 4.0)
    assert w[0] == 0 and w[1] == 1
    assert torch.all(w[2:] < w[1:-1])
    torch.testing.assert_close(w[5], torch.tensor(float(np.exp(-1.0))))


def test_anchors_are_response_positions_with_a_next_token():
    gen = torch.Generator().manual_seed(0)
    anchors = sample_anchors(5, 30, 10, gen)
    assert anchors.numel() == 10 and torch.all(anchors[1:] > anchors[:-1])
    assert anchors.min() >= 5 and anchors.max() <= 28
    assert sample_anchors(5, 9, 10, gen).tolist() == [5, 6, 7]


# -- attention masks ------------------------------------------------------------------------------------------
def test_training_mask_on_small_shapes():
    """Block j sees the context positions before its anchor and its own block, nothing else."""
    mask = training_attention_mask(torch.tensor([2, 4]), seq_len=6, block_size=3).int()
    expected = torch.tensor([
        # context 0..5      block 0   block 1
        [1, 1, 0, 0, 0, 0,  1, 1, 1,  0, 0, 0],
        [1, 1, 0, 0, 0, 0,  1, 1, 1,  0, 0, 0],
        [1, 1, 0, 0, 0, 0,  1, 1, 1,  0, 0, 0],
        [1, 1, 1, 1, 0, 0,  0, 0, 0,  1, 1, 1],
        [1, 1, 1, 1, 0, 0,  0, 0, 0,  1, 1, 1],
        [1, 1, 1, 1, 0, 0,  0, 0, 0,  1, 1, 1],
    ])
    assert torch.equal(mask, expected)
    assert torch.equal(context_visibility(torch.tensor([0, 3]), 4).int(), torch.tensor([[0, 0, 0, 0], [1, 1, 1, 0]]))


@pytest.mark.parametrize("visible", [True, False])
def test_block_attention_equals_dense_masked_attention(visible):
    """`attend` (context part + block-diagonal, one softmax, grouped KV heads) is plain attention under the
    dense mask: the training mask, or at inference (one block, all context visible) no mask at all."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, d, n, b = 4, 2, 8, 7, 3
    anchors = torch.tensor([1, 4, 6]) if visible else torch.tensor([7])
    a = anchors.numel()
    q = torch.randn(heads, a, b, d, generator=gen)
    ctx = (torch.randn(kv_heads, n, d, generator=gen), torch.randn(kv_heads, n, d, generator=gen))
    blk = (torch.randn(kv_heads, a, b, d, generator=gen), torch.randn(kv_heads, a, b, d, generator=gen))
    out = attend(q, ctx, blk, context_visibility(anchors, n) if visible else None, d**-0.5)
    keys = torch.cat([ctx[0], blk[0].reshape(kv_heads, a * b, d)], dim=1).repeat_interleave(heads // kv_heads, 0)
    values = torch.cat([ctx[1], blk[1].reshape(kv_heads, a * b, d)], dim=1).repeat_interleave(heads // kv_heads, 0)
    mask = training_attention_mask(anchors, n, b)
    if not visible:
        assert mask.all()  # one block after the whole context: nothing is masked, not even "later" slots
    dense = F.scaled_dot_product_attention(q.reshape(heads, a * b, d), keys, values, attn_mask=mask)
    torch.testing.assert_close(out.reshape(heads, a * b, d), dense, rtol=1e-5, atol=1e-5)


def test_block_attention_is_bidirectional(zoo):
    """A block slot sees the slots after it: changing the last slot's token changes the first slot's output."""
    target = zoo.load("llama", "float32")
    drafter = attached(target)
    ids = torch.randint(3, target.vocab_size, (10,), generator=torch.Generator().manual_seed(2))
    feats = FeatureExtractor(target, drafter.config.runtime_layers).compute(ids.tolist())
    with torch.no_grad():
        fused = torch.cat([feats.hidden[i] for i in drafter.config.runtime_layers], -1)
        kv = drafter.context_kv(drafter.context(fused), torch.arange(10))
        block = drafter.block_tokens(ids[-1:])
        positions = torch.arange(9, 17)[None]
        h1 = drafter.blocks(block, positions, kv, None)
        block[0, -1] = 5
        h2 = drafter.blocks(block, positions, kv, None)
    assert not torch.allclose(h1[0, 0], h2[0, 0])


def test_training_forward_equals_inference_forward(zoo):
    """The block of an anchor in the many-block training forward computes exactly what inference computes
    with the context cache holding the positions before that anchor (catches off-by-ones of mask, positions,
    layer indices and labels)."""
    target = zoo.load("llama", "float32")
    drafter = attached(target, block_size=8)
    c = drafter.config
    ids = torch.randint(3, target.vocab_size, (24,), generator=torch.Generator().manual_seed(1))
    feats = FeatureExtractor(target, c.runtime_layers).compute(ids.tolist())
    anchors = torch.tensor([6, 11, 17, 22])
    with torch.no_grad():
        fused = torch.cat([feats.hidden[i] for i in c.runtime_layers], -1)
        kv = drafter.context_kv(drafter.context(fused), torch.arange(24))
        positions = anchors[:, None] + torch.arange(8)[None]
        trained = drafter.blocks(drafter.block_tokens(ids[anchors]), positions, kv, context_visibility(anchors, 24))
        for j, a in enumerate(anchors.tolist()):
            cache = ContextCache(c, 64, torch.float32, torch.device("cpu"))
            cache.append(drafter.context_kv(drafter.context(fused[:3]), torch.arange(3)))  # in two chunks, as steps do
            cache.append(drafter.context_kv(drafter.context(fused[3:a]), torch.arange(3, a)))
            block = drafter.block_tokens(ids[a : a + 1])
            h = drafter.blocks(block, torch.arange(a, a + 8)[None], cache.views(), None)
            torch.testing.assert_close(h[0], trained[j], rtol=1e-4, atol=1e-4)
    # and the loss scores slot i of anchor a against token a + i with the target's state at a + i - 1
        # the loss scores slot i of anchor a against the target's distribution at a + i - 1 (for token a + i)
        loss, m = dflash_loss(drafter, ids, feats, anchors[:1], drafter.target_to_draft(), gamma=4.0)
        logp = F.log_softmax(drafter.draft_logits(trained[0, 1:]), -1)
        p = torch.softmax(drafter.draft_logits_from_normed(feats.final_hidden[6:13]), -1)
        w = position_weights(8, 4.0)[1:]
        torch.testing.assert_close(loss, (w * -(p * logp).sum(-1)).sum() / w.sum(), rtol=1e-5, atol=1e-5)
    _, m = dflash_loss(drafter, ids, feats, anchors, drafter.target_to_draft(), gamma=4.0)
    assert m.counted[0] == 4 and len(m.counted) == 7  # anchor 22: only slot 1 (token 23) is in the sequence


def test_context_cache_holds_committed_positions_only(zoo, tmp_path):
    """After steps with rejections, the drafter's cache equals the context of the committed sequence
    computed from scratch: rejected drafts and block slots never enter it."""
    target = zoo.load("llama", "float32")
    path = make_random_dflash(target, tmp_path / "d", block_size=8)
    proposer = DFlashProposer(DFlashOptions(model=path, num_speculative_tokens=7), target)
    runtime = target.new_runtime()
    prompt = [1, 40, 41, 42, 43, 44]
    runtime.reset(256)
    prefill = runtime.prefill(prompt, capture=proposer.target_layers)
    proposer.begin(prompt, SamplingParams(temperature=0.0), None, 256, prefill)
    tokens = [*prompt, int(prefill.logits[-1].argmax())]
    for accepted in (0, 3, 7, 1):
        draft = proposer.propose(tokens, 50)
        assert len(draft) == 7 and proposer.cache.length == len(tokens) - 1
        verified = runtime.forward([tokens[-1], *draft.tokens], capture=proposer.target_layers)
        runtime.commit(range(accepted + 1))
        proposer.feedback(accepted, verified)
        tokens += [*draft.tokens[:accepted], int(verified.logits[accepted].argmax())]  # pretend they matched
    proposer.propose(tokens, 50)
    n = len(tokens) - 1
    feats = FeatureExtractor(target, proposer.target_layers).compute(tokens[:n])
    d = proposer.drafter
    with torch.no_grad():
        kv = d.context_kv(d.context(torch.cat([feats.hidden[i] for i in proposer.target_layers], -1)), torch.arange(n))
    for (k, v), (ck, cv) in zip(kv, proposer.cache.views(), strict=True):
        torch.testing.assert_close(ck, k, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cv, v, rtol=1e-4, atol=1e-4)



def test_a_request_never_drafted_costs_no_drafter_work_and_catches_up_later(zoo, tmp_path):
    """The prompt's context entries wait for the first drafting step: begin and steps without a draft leave the
    drafter's cache empty, and catch_up_batch then makes the entries one call would, so drafts are the same."""
    target = zoo.load("llama", "float32")
    path = make_random_dflash(target, tmp_path / "d", block_size=8)
    prompt = [1, *range(40, 70)]
    lazy, eager = (DFlashProposer(DFlashOptions(model=path, num_speculative_tokens=7), target) for _ in range(2))
    runtime = target.new_runtime()
    runtime.reset(256)
    prefill = runtime.prefill(prompt, capture=lazy.target_layers)
    tokens = [*prompt, int(prefill.logits[-1].argmax())]
    for p in (lazy, eager):
        p.begin(prompt, SamplingParams(temperature=0.0), None, 256, prefill)
    assert lazy.cache.length == 0 and lazy.pending.shape[0] == len(prompt)
    DFlashProposer.catch_up_batch([eager], [tokens])
    assert eager.cache.length == len(prompt) and eager.pending is None
    assert lazy.propose(tokens, 7).tokens == eager.propose(tokens, 7).tokens


# -- format ---------------------------------------------------------------------------------------------------
def test_save_load_round_trip_and_speculators_layout(zoo, tmp_path):
    target = zoo.load("llama")
    path = make_random_dflash(target, tmp_path / "d", draft_vocab_size=100, block_size=16, seed=3)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash"
    assert config["architectures"] == ["DFlashSpeculator"]
    assert config["block_size"] == 16 and config["draft_vocab_size"] == 100
    assert config["mask_token_id"] == target.tokenizer.pad_token_id  # the byte tokenizer has no mask token
    assert config["aux_hidden_state_layer_ids"] == default_target_layer_ids(target.num_layers)
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2
    assert config["speculators_config"]["algorithm"] == "dflash"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 15
    assert config["speculators_config"]["verifier"]["vocab_size"] == target.vocab_size
    drafter, _ = load_dflash(path, target)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert "lm_head.weight" not in saved and "embed_tokens.weight" not in saved  # shared with the target
    assert "layers.1.self_attn.k_norm.weight" in saved and "hidden_norm.weight" in saved and "fc.weight" in saved
    assert set(saved) == set(drafter.state_dict())
    for name, tensor in drafter.state_dict().items():
        torch.testing.assert_close(tensor.to(saved[name].dtype), saved[name])
    assert int(drafter.t2d.sum()) == 100 and drafter.config.block_size == 16


def test_drafter_for_another_target_is_refused(zoo, tmp_path):
    path = make_random_dflash(zoo.load("llama"), tmp_path / "d")
    with pytest.raises(ValueError, match="trained for"):
        LLM(loaded=zoo.load("llama_draft"), speculative_config={"method": "dflash", "model": path})
    with pytest.raises(ValueError, match="not 'dflash'"):
        from eagle3_helpers import make_random_eagle3

        eagle = make_random_eagle3(zoo.load("llama"), tmp_path / "e")
        LLM(loaded=zoo.load("llama"), speculative_config={"method": "dflash", "model": eagle})


def test_num_speculative_tokens_is_capped_at_the_block(zoo, tmp_path):
    target = zoo.load("llama")
    path = make_random_dflash(target, tmp_path / "d", block_size=8)
    llm = LLM(loaded=target, speculative_config={"method": "dflash", "model": path})
    assert llm.proposer.num_speculative_tokens == 7
    llm = LLM(loaded=target, speculative_config={"method": "dflash", "model": path, "num_speculative_tokens": 3})
    assert llm.proposer.num_speculative_tokens == 3


# -- losslessness ---------------------------------------------------------------------------------------------
TREE = {"tree_top_k": 3, "tree_num_draft_tokens": 12}


@pytest.mark.parametrize("tree", [None, TREE])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_greedy_equals_plain_decoding(zoo, tmp_path, family, block_size, tree):
    target = zoo.load(family)
    path = make_random_dflash(target, tmp_path / "d", draft_vocab_size=200, block_size=block_size)
    plain = LLM(loaded=target)
    spec = LLM(loaded=target, speculative_config={"method": "dflash", "model": path, **(tree or {})})
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        want = plain.generate(prompt, params)[0].outputs[0].token_ids
        assert spec.generate(prompt, params)[0].outputs[0].token_ids == want


@pytest.fixture(scope="module")
def small_vocab_drafter(zoo, tmp_path_factory):
    """Briefly trained (a random one is accepted too rarely to test the accept path), reduced vocab."""
    target = zoo.load("small_vocab")
    out = tmp_path_factory.mktemp("sv_dflash")
    settings = TrainSettings(max_steps=30, tokens_per_step=256, lr=1e-2, warmup_steps=5, val_fraction=0.0,
                             checkpoint_every=100)
    options = DFlashTrainOptions(block_size=4, num_layers=1, draft_vocab_size=10, num_anchors=16)
    train_dflash(target, greedy_samples(target, 32, response_len=24), out, settings, options, progress=False)
    return str(out)


SHAPES = {"chain": {}, "tree": TREE, "threshold": {"confidence_threshold": 0.3}}


@pytest.mark.parametrize("case,shape", [("t1", "chain"), ("warped", "chain"), ("t1", "tree"), ("t1", "threshold")])
def test_sampling_distribution_matches_the_target(zoo, small_prompt, exact_first_tokens,  # noqa: F811
                                                  small_vocab_drafter, case, shape):
    config = {"method": "dflash", "model": small_vocab_drafter, **SHAPES[shape]}
    llm = LLM(loaded=zoo.load("small_vocab"), speculative_config=config)
    assert_first_tokens_follow_the_target(llm, small_prompt, NUM_SAMPLES, SAMPLING_CASES[case],
                                          exact_first_tokens[case])
    assert llm.stats.num_accepted_tokens >= 100, llm.stats.num_accepted_tokens
    assert llm.stats.acceptance_rate < 0.95


# -- training -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_bigram_drafter(zoo, tmp_path_factory):
    """A drafter trained briefly on the bigram target (next token = f(current token)): learnable in seconds."""
    target = zoo.load("bigram")
    samples = greedy_samples(target, 64)
    out = tmp_path_factory.mktemp("bigram_dflash")
    settings = TrainSettings(max_steps=60, tokens_per_step=256, lr=1e-2, warmup_steps=5, val_fraction=0.1,
                             checkpoint_every=20)
    options = DFlashTrainOptions(block_size=8, num_layers=2, draft_vocab_size=256, num_anchors=32)
    report = train_dflash(target, samples, out, settings, options, progress=False)
    return out, report


def test_training_reduces_loss_and_writes_a_drafter(trained_bigram_drafter):
    out, report = trained_bigram_drafter
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 60 and len(log[-1]["acc"]) == 7  # one conditional acceptance rate per draft slot
    first, last = np.mean([r["loss"] for r in log[:5]]), np.mean([r["loss"] for r in log[-5:]])
    assert last < 0.5 * first, (first, last)
    assert report["validation"]["step_accuracy"][0] > 0.5  # about 0.6 after 60 steps
    assert report["validation"]["estimated_chain_acceptance_length"] > 2.0  # about 3
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_the_validation_walk_is_the_acceptance_decoding_measures(zoo, trained_bigram_drafter):
    """The report's greedy_walk_acceptance_length is what decoding the held-out responses measures (K = the
    block's 7 slots, greedy); the position average of the slot accuracies is not."""
    out, report = trained_bigram_drafter
    target = zoo.load("bigram")
    _, val = split(greedy_samples(target, 64), 0.1)  # the fixture's held-out samples
    spec = LLM(loaded=target, speculative_config={"method": "dflash", "model": str(out)})
    for s in val:
        spec.generate({"prompt_token_ids": s.prompt_ids},
                      SamplingParams(temperature=0.0, max_tokens=len(s.response_ids), ignore_eos=True))
    walk, measured = report["validation"]["greedy_walk_acceptance_length"], spec.stats.mean_acceptance_length
    assert measured > 1.5 and abs(walk - measured) < 0.1 * measured, (walk, measured)


def test_trained_drafter_is_accepted(zoo, trained_bigram_drafter, tmp_path):
    """Acceptance regression: a feature/position misalignment at inference would bring the trained drafter
    down to an untrained one's acceptance while the outputs stay right."""
    out, _ = trained_bigram_drafter
    target = zoo.load("bigram")
    untrained = make_random_dflash(target, tmp_path / "random", draft_vocab_size=256)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = [s.prompt_ids for s in greedy_samples(target, 4, seed=9)]  # unseen, same distribution
    plain = LLM(loaded=target)
    rates = {}
    runs = (("trained", str(out), {}), ("untrained", untrained, {}), ("tree", str(out), TREE),
            ("threshold", str(out), {"confidence_threshold": 0.5}))
    drafted = {}
    for name, path, extra in runs:
        spec = LLM(loaded=target, speculative_config={"method": "dflash", "model": path, **extra})
        for prompt in prompts:
            want = plain.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids
            assert spec.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids == want
        rates[name] = spec.stats.mean_acceptance_length
        drafted[name] = spec.stats.num_draft_tokens / max(spec.stats.num_drafts, 1)
    assert rates["trained"] > 1.8 and rates["trained"] - 1 > 3 * (rates["untrained"] - 1), rates
    assert rates["tree"] > 1.8, rates
    # the threshold drops the unsure tail of the block: fewer rows verified for most of the acceptance
    assert drafted["threshold"] < drafted["trained"] and rates["threshold"] > 1.8, (drafted, rates)


def test_resume_continues_where_it_stopped(zoo, tmp_path):
    target = zoo.load("bigram")
    samples = greedy_samples(target, 16, seed=1)
    opts = DFlashTrainOptions(block_size=8, num_layers=1, draft_vocab_size=256, num_anchors=8)
    short = TrainSettings(max_steps=4, tokens_per_step=256, lr=1e-3, warmup_steps=2, checkpoint_every=2)
    train_dflash(target, samples, tmp_path / "r", short, opts, progress=False)
    with pytest.raises(FileExistsError):
        train_dflash(target, samples, tmp_path / "r", short, opts, progress=False)
    longer = TrainSettings(max_steps=8, tokens_per_step=256, lr=1e-3, warmup_steps=2, checkpoint_every=2)
    report = train_dflash(target, samples, tmp_path / "r", longer, opts, resume=True, progress=False)
    assert report["steps"] == 8
    steps = [json.loads(line)["step"] for line in (tmp_path / "r" / "train_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
    drafter, config = load_dflash(tmp_path / "r", target)
    assert config["specdec"]["training"]["steps"] == 8 and drafter.config.num_hidden_layers == 1


def test_init_from_fine_tunes_a_saved_drafter_in_its_own_shape(zoo, tmp_path):
    from specdec.training.train_dflash import DFlashObjective

    target = zoo.load("bigram")
    start_dir = make_random_dflash(target, tmp_path / "start", draft_vocab_size=200, block_size=4, seed=3)
    start, _ = load_dflash(start_dir, target)
    samples = greedy_samples(target, 4)
    tuned = DFlashObjective(target, samples, DFlashTrainOptions(init_from=start_dir, draft_vocab_size=50), None, 0).model
    assert tuned.config.block_size == 4 and tuned.config.num_hidden_layers == start.config.num_hidden_layers
    assert set(tuned.draft_ids().tolist()) <= set(start.draft_ids().tolist()) and tuned.draft_ids().numel() == 50
    start_state = start.state_dict()
    for name, tensor in tuned.state_dict().items():
        if name not in ("d2t", "t2d"):
            assert torch.equal(start_state[name].to(tensor.dtype), tensor), name
    with pytest.raises(ValueError, match="fixes the drafter's shape"):
        DFlashObjective(target, samples, DFlashTrainOptions(init_from=start_dir, num_layers=3), None, 0)
    # a longer block from the same weights: every slot position is new work for RoPE, not for the weights
    longer = DFlashObjective(target, samples, DFlashTrainOptions(init_from=start_dir, block_size=8), None, 0).model
    assert longer.config.block_size == 8
    assert all(torch.equal(t, tuned.state_dict()[n]) for n, t in longer.state_dict().items() if n not in ("d2t", "t2d"))


def test_confidence_threshold_is_for_chains_and_checked():
    assert DFlashOptions(model="d", confidence_threshold=0.3).problems() == []
    assert any("chain drafts" in p for p in DFlashOptions(model="d", confidence_threshold=0.3, tree_top_k=3).problems())
    assert DFlashOptions(model="d", confidence_threshold=1.5).problems()
