"""MTP: training forward equals chained inference, checkpoint MTP layers, training, format, losslessness."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from specdec import LLM, SamplingParams
from specdec.drafting.mtp import MTPState
from specdec.drafting.mtp_format import load_mtp
from specdec.drafting.mtp_model import unroll
from specdec.drafting.mtp_tree import MTPTreeGrower
from specdec.models.loading import load_model
from specdec.training.features import FeatureExtractor
from specdec.training.mtp_objective import step_weights
from specdec.training.train_mtp import MTPTrainOptions, train_mtp
from specdec.training.trainer import TrainSettings

from conftest import MODEL_SPECS
from eagle3_helpers import greedy_samples
from mtp_helpers import make_mtp_checkpoint, make_random_mtp, random_mtp
from stat_helpers import assert_first_tokens_follow_the_target
from test_engine import NUM_SAMPLES, SAMPLING_CASES, exact_first_tokens, small_prompt  # noqa: F401 (fixtures)

PROMPTS = ["The quick brown fox", "Once upon a time, in a land", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def _same_greedy(target, config, prompts=PROMPTS) -> LLM:
    plain, spec = LLM(loaded=target), LLM(loaded=target, speculative_config=config)
    for prompt in prompts:
        assert spec.generate(prompt, GREEDY)[0].outputs[0].token_ids == plain.generate(prompt, GREEDY)[0].outputs[0].token_ids
    return spec


def test_step_weights_follow_the_reference():
    assert [round(w, 2) for w in step_weights(3, 0.6)] == [0.51, 0.31, 0.18]


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_training_forward_equals_chained_inference(zoo, family):
    """Depth k of the training forward at position t must be what inference computes for the draft d_k
    after committing positions 0..t, whatever was committed before and however many depths ran: an
    off-by-one between hidden states and tokens silently collapses acceptance."""
    target = zoo.load(family, "float32")
    drafter = random_mtp(target.decoder.arch, target.vocab_size, num_modules=2).eval()  # depth 3 reuses module 2
    drafter.attach_target(target.decoder)
    drafter.prepare()
    ids = torch.randint(3, target.vocab_size, (24,), generator=torch.Generator().manual_seed(1))
    final = FeatureExtractor(target, []).compute(ids.tolist()).final_hidden
    depths = 3
    with torch.no_grad():
        trained = [drafter.logits(drafter.module_for(k + 1), h) for k, h in enumerate(unroll(drafter, ids, final, depths))]
    state = MTPState(drafter, depths, capacity=64)
    committed = 0
    # t = last committed position; a depth of 1 leaves the deeper caches to catch up later
    for t, depth in [(0, 3), (1, 3), (2, 3), (5, 1), (6, 2), (7, 3), (12, 3), (13, 3)]:
        state.add(final[committed : t + 1])
        committed = t + 1
        forced = lambda k, logits: (int(ids[t + 1 + k]), None)  # noqa: E731 (the data's next tokens)
        state.draft(ids[: t + 2].tolist(), depth, forced)
        assert len(state.last_logits) == depth
        for k in range(1, depth + 1):
            if t < trained[k - 1].shape[0]:
                torch.testing.assert_close(state.last_logits[k - 1], trained[k - 1][t], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_tree_nodes_draft_what_their_forced_chain_drafts(zoo, family):
    """Every expanded tree node's entry (its children's logits) must equal what a chain computes when forced
    along that node's path, after the same commits: a tree row that sees a sibling's entry, or reads the wrong
    parent output or position, drafts plausible but different tokens and only lowers acceptance."""
    target = zoo.load(family, "float32")
    drafter = random_mtp(target.decoder.arch, target.vocab_size, num_modules=2).eval()
    drafter.attach_target(target.decoder)
    drafter.prepare()
    ids = torch.randint(3, target.vocab_size, (30,), generator=torch.Generator().manual_seed(2))
    final = FeatureExtractor(target, []).compute(ids.tolist()).final_hidden
    depth, top_k = 3, 2
    tree_state, chain_state = MTPState(drafter, depth, capacity=64), MTPState(drafter, depth, capacity=64)
    committed, checked = 0, 0
    for t in [0, 1, 4, 5, 9, 10, 11, 17]:  # last committed position; short histories hit position 0
        tree_state.add(final[committed : t + 1])
        chain_state.add(final[committed : t + 1])
        committed = t + 1
        tokens = ids[: t + 2].tolist()
        grower = MTPTreeGrower(tree_state, tokens)
        nodes = grower.grow(depth, top_k, total=63, min_score=float("-inf"))  # all kept: indices unchanged
        assert len(nodes) == top_k + 2 * top_k * top_k
        for (k, u), out in grower.owned.items():
            if nodes[u].depth != k - 1:
                continue  # an ancestor's entry at a deeper depth: checked through the frontier's logits
            path, a = [], u
            while a != -1:
                path.insert(0, int(drafter.draft_to_target(torch.tensor(nodes[a].token))))
                a = nodes[a].parent
            forced = lambda j, logits, path=path: (path[j - 1] if j <= len(path) else 0, None)  # noqa: E731
            chain = copy.deepcopy(chain_state, memo={id(drafter): drafter})  # a step drafts once
            chain.draft(tokens, k, forced)
            with torch.no_grad():
                tree_logits = drafter.logits(drafter.module_for(k), out[None])[0]
            torch.testing.assert_close(tree_logits, chain.last_logits[k - 1], rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked == 8 * top_k * (depth - 1)  # each level's frontier, at every step


@pytest.fixture(scope="module")
def mtp_checkpoint(zoo, tmp_path_factory):
    """The llama tiny model (same seed: same trunk) with two MTP layers after its trunk."""
    return make_mtp_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama-mtp", MODEL_SPECS["llama"], num_mtp=2)


def test_checkpoint_with_mtp_layers_still_loads_as_a_target(zoo, mtp_checkpoint):
    target, plain = load_model(mtp_checkpoint, dtype="float32", device="cpu"), zoo.load("llama", "float32")
    assert target.decoder.num_layers == plain.decoder.num_layers  # the MTP layers are not trunk layers
    ids = list(range(5, 30))
    a, b = target.new_runtime(), plain.new_runtime()
    a.reset(128)
    b.reset(128)
    assert torch.equal(a.forward(ids).logits, b.forward(ids).logits)


def test_checkpoint_mtp_layers_are_loaded_and_draft(mtp_checkpoint):
    target = load_model(mtp_checkpoint, dtype="bfloat16", device="cpu")
    # "none": the blocks keep the checkpoint's bfloat16 weights, compared below
    spec = _same_greedy(target, {"method": "mtp", "num_speculative_tokens": 3, "quantization": "none"})
    drafter = spec.proposer.drafter
    assert drafter.config.num_modules == 2 and drafter.config.draft_vocab_size == target.vocab_size
    stored = load_file(f"{mtp_checkpoint}/model.safetensors")
    L = target.num_layers
    for m in range(2):
        mine = drafter.layers[m]
        torch.testing.assert_close(mine.eh_proj.weight, stored[f"model.layers.{L + m}.eh_proj.weight"].bfloat16())
        torch.testing.assert_close(mine.enorm, stored[f"model.layers.{L + m}.enorm.weight"].bfloat16())
        q = stored[f"model.layers.{L + m}.self_attn.q_proj.weight"].bfloat16()
        torch.testing.assert_close(mine.block.qkv.weight[: q.shape[0]], q)
        down = stored[f"model.layers.{L + m}.mlp.down_proj.weight"].bfloat16()
        torch.testing.assert_close(mine.block.down.weight, down)
    assert spec.stats.num_draft_tokens > 0


def test_target_without_mtp_layers_is_a_clear_error(zoo):
    with pytest.raises(ValueError, match="carries no MTP layers"):
        LLM(loaded=zoo.load("llama"), speculative_config={"method": "mtp"})


TREE = {"tree_top_k": 3, "tree_num_draft_tokens": 8}


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("modules", [1, 2])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_greedy_equals_plain_decoding(zoo, tmp_path, family, modules, shape):
    target = zoo.load(family)
    path = make_random_mtp(target, tmp_path / "d", draft_vocab_size=200, num_modules=modules)
    _same_greedy(target, {"method": "mtp", "model": path, "num_speculative_tokens": 3,
                          **(TREE if shape == "tree" else {})})


def test_save_load_round_trip_in_the_deepseek_layout(zoo, tmp_path):
    target = zoo.load("llama")
    path = make_random_mtp(target, tmp_path / "d", draft_vocab_size=100, seed=3, num_modules=2)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["speculators_model_type"] == "mtp" and config["architectures"] == ["MTPSpeculator"]
    assert config["num_nextn_predict_layers"] == 2 and config["draft_vocab_size"] == 100
    assert config["speculators_config"]["verifier"]["vocab_size"] == target.vocab_size
    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    L = target.num_layers
    assert {f"model.layers.{L}.eh_proj.weight", f"model.layers.{L + 1}.self_attn.q_proj.weight",
            f"model.layers.{L + 1}.shared_head.norm.weight", "d2t", "t2d"} <= set(saved)
    assert not any("embed_tokens" in k or "lm_head" in k or "shared_head.head" in k for k in saved)  # shared
    drafter, _ = load_mtp(path, target)
    for name, tensor in drafter.to_checkpoint_tensors().items():
        torch.testing.assert_close(tensor.to(saved[name].dtype), saved[name])
    assert int(drafter.t2d.sum()) == 100


def test_drafter_for_another_target_is_refused(zoo, tmp_path):
    path = make_random_mtp(zoo.load("llama"), tmp_path / "d")
    with pytest.raises(ValueError, match="trained for"):
        LLM(loaded=zoo.load("llama_draft"), speculative_config={"method": "mtp", "model": path})


@pytest.fixture(scope="module")
def trained_bigram_mtp(zoo, tmp_path_factory):
    """Trained briefly on the bigram target (next token = f(current token)), full vocabulary."""
    target = zoo.load("bigram")
    out = tmp_path_factory.mktemp("bigram_mtp")
    settings = TrainSettings(max_steps=60, tokens_per_step=256, lr=3e-3, warmup_steps=5, val_fraction=0.1,
                             checkpoint_every=20)
    report = train_mtp(target, greedy_samples(target, 64), out, settings,
                       MTPTrainOptions(draft_vocab_size=target.vocab_size, steps=3), progress=False)
    return out, report


def test_training_reduces_loss_and_writes_a_drafter(trained_bigram_mtp):
    out, report = trained_bigram_mtp
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 60
    first, last = np.mean([r["loss"] for r in log[:5]]), np.mean([r["loss"] for r in log[-5:]])
    assert last < 0.5 * first, (first, last)
    assert report["validation"]["step_accuracy"][0] > 0.5
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_trained_drafter_is_accepted_and_works_from_a_checkpoint(zoo, trained_bigram_mtp, tmp_path):
    """Acceptance regression (trained vs untrained), and the same modules written into the target's
    checkpoint (DeepSeek layout) draft exactly as the drafter directory does."""
    out, _ = trained_bigram_mtp
    target = zoo.load("bigram")
    untrained = make_random_mtp(target, tmp_path / "random")
    drafter, _ = load_mtp(out, target)
    checkpoint = make_mtp_checkpoint(tmp_path / "ckpt", MODEL_SPECS["bigram"], num_mtp=1,
                                     tensors=drafter.to_checkpoint_tensors())
    prompts = [s.prompt_ids for s in greedy_samples(target, 4, seed=9)]  # unseen, same distribution
    rates = {}
    for name, loaded, model in (("trained", target, str(out)), ("untrained", target, untrained),
                                ("checkpoint", load_model(checkpoint, device="cpu"), None)):
        config = {"method": "mtp", "num_speculative_tokens": 3, **({"model": model} if model else {})}
        spec = _same_greedy(loaded, config, [{"prompt_token_ids": p} for p in prompts])
        rates[name] = spec.stats.mean_acceptance_length
    tree = _same_greedy(target, {"method": "mtp", "model": str(out), "num_speculative_tokens": 3, **TREE},
                        [{"prompt_token_ids": p} for p in prompts])
    rates["tree"] = tree.stats.mean_acceptance_length
    assert rates["tree"] >= 0.97 * rates["trained"], rates  # the greedy chain is (almost always) in the tree
    assert rates["trained"] > 1.8 and rates["trained"] - 1 > 3 * (rates["untrained"] - 1), rates
    assert rates["checkpoint"] == rates["trained"], rates


@pytest.fixture(scope="module")
def small_vocab_mtp(zoo, tmp_path_factory):
    target = zoo.load("small_vocab")
    return make_random_mtp(target, tmp_path_factory.mktemp("sv_mtp") / "d", draft_vocab_size=10, seed=2,
                           num_modules=2)


@pytest.mark.parametrize("case", ["t1", "warped", "t1-tree"])
def test_sampling_distribution_matches_the_target(zoo, small_prompt, exact_first_tokens, small_vocab_mtp,  # noqa: F811
                                                  case):
    tree = case.endswith("-tree")
    case = case.removesuffix("-tree")
    llm = LLM(loaded=zoo.load("small_vocab"),
              speculative_config={"method": "mtp", "model": small_vocab_mtp, "num_speculative_tokens": 3,
                                  **(TREE if tree else {})})
    assert_first_tokens_follow_the_target(llm, small_prompt, NUM_SAMPLES, SAMPLING_CASES[case],
                                          exact_first_tokens[case])
    assert llm.stats.num_accepted_tokens >= 100, llm.stats.num_accepted_tokens
    assert llm.stats.acceptance_rate < 0.95


# -- the prompt read at begin, with the prefill ---------------------------------------------------------------
K = 3
ACCEPT = [2, 0, 1, 3, 1]  # tokens kept per step (the drafts are compared, not the target's verdicts)
STEP_CASES = {  # shape, temperature, through propose_batch (mtp_batch.draft_chains) or propose
    "chain-greedy": ({}, 0.0, False), "chain-sampled": ({}, 0.9, False),
    "batch-greedy": ({}, 0.0, True), "batch-sampled": ({}, 0.9, True),
    "tree-greedy": (TREE, 0.0, False), "tree-sampled": (TREE, 0.9, False),
}


def _prompts(target, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, target.vocab_size, (n,), generator=g).tolist() for n in lengths]


def _run_steps(llm, prompts, temperature, batched, read=True):
    """The drafts of len(ACCEPT) propose/feedback steps after each prompt (all stepped together, through
    propose_batch when `batched`), verified by the target's own forward, and the proposers after; `read`
    False: begin leaves the prompt to the first draft (the old behaviour)."""
    from specdec.drafting.mtp import MTPProposer

    params = SamplingParams(temperature=temperature, max_tokens=64)
    ps, runtimes, seqs = [], [], []
    with pytest.MonkeyPatch.context() as mp:
        if not read:
            mp.setattr(MTPState, "read", lambda self, tokens: None)
        for i, prompt in enumerate(prompts):
            p, runtime = llm.new_proposer(), llm.model.new_runtime()
            runtime.reset(len(prompt) + 64)
            p.begin(prompt, params, torch.Generator().manual_seed(i), len(prompt) + 64, runtime.prefill(prompt))
            ps.append(p)
            runtimes.append(runtime)
            seqs.append([*prompt, 5])  # any pending token
    drafts = []
    for a in ACCEPT:
        step = (MTPProposer.propose_batch(ps, seqs, [K] * len(ps)) if batched
                else [p.propose(s, K) for p, s in zip(ps, seqs)])
        drafts.append(step)
        for p, runtime, seq, d in zip(ps, runtimes, seqs, step):
            if d.parents is None:
                path, parents = list(range(min(a, len(d.tokens)))), None
            else:  # the first child's path
                path = []
                for i, parent in enumerate(d.parents):
                    if len(path) < a and parent == (path[-1] if path else -1):
                        path.append(i)
                parents = [-1, *(q + 1 for q in d.parents)]
            verified = runtime.forward([seq[-1], *d.tokens], parents=parents)
            runtime.commit([0, *(i + 1 for i in path)])
            p.feedback(len(path), verified, path if d.parents is not None else None)
            seq.extend([d.tokens[i] for i in path] + [int(verified.logits[path[-1] + 1 if path else 0].argmax())])
    return drafts, ps


def _assert_same(drafts_a, ps_a, drafts_b, ps_b):
    """Same drafts (tokens, tree, distributions) at every step, and bit-identical depth caches after."""
    for step_a, step_b in zip(drafts_a, drafts_b, strict=True):
        for a, b in zip(step_a, step_b, strict=True):
            assert a.tokens == b.tokens and a.parents == b.parents
            assert (a.probs is None and b.probs is None) or torch.equal(a.probs, b.probs)
    for pa, pb in zip(ps_a, ps_b, strict=True):
        sa, sb = pa.state, pb.state
        assert all(torch.equal(x, y) for x, y in zip(sa.last_logits, sb.last_logits, strict=True))
        for ca, cb, oa, ob in zip(sa.caches, sb.caches, sa.outputs, sb.outputs, strict=True):
            n = ca.length
            assert cb.length == n > 0
            assert torch.equal(ca.keys_t[..., :n], cb.keys_t[..., :n])
            assert torch.equal(ca.values[:, :, :n], cb.values[:, :, :n])
            assert torch.equal(oa[:n], ob[:n])


@pytest.fixture(scope="module")
def mtp_llms(zoo, tmp_path_factory):
    """family -> (chain LLM, tree LLM) with a random two-module drafter (depth 3 reuses module 2)."""
    out = {}
    for family in ("llama", "gemma3_text"):
        target = zoo.load(family)
        path = make_random_mtp(target, tmp_path_factory.mktemp(f"mtp_{family}") / "d", draft_vocab_size=200,
                               num_modules=2)
        out[family] = tuple(LLM(loaded=target, speculative_config={"method": "mtp", "model": path,
                                                                   "num_speculative_tokens": K, **tree})
                            for tree in ({}, TREE))
    return out


def _block_rows(monkeypatch, llm) -> list[int]:
    """Rows of every MTP block call from now on (DecoderLayer.forward_batch: `run` goes through it too; the
    target's layers are DecoderLayers as well, and not counted)."""
    rows: list[int] = []
    drafter = llm.new_proposer().drafter  # shared by the LLM's proposers
    blocks = {id(m.block) for m in drafter.layers}
    real = type(drafter.layers[0].block).forward_batch

    def counting(self, h, *args):
        if id(self) in blocks:
            rows.append(h.shape[0])
        return real(self, h, *args)

    monkeypatch.setattr(type(drafter.layers[0].block), "forward_batch", counting)
    return rows


@pytest.mark.parametrize("batched", [False, True])
def test_begin_reads_the_prompt_and_the_first_draft_only_its_last_positions(mtp_llms, monkeypatch, batched):
    """Depth k's entries whose t_{i+k} the prompt holds are read at begin; the first draft runs only the
    k positions at depth k that need the pending token (or drafted ones), as a later draft does."""
    from specdec.drafting.mtp import MTPProposer

    llm = mtp_llms["llama"][0]
    prompt = _prompts(llm.model, [9])[0]
    rows = _block_rows(monkeypatch, llm)
    p, runtime = llm.new_proposer(), llm.model.new_runtime()
    runtime.reset(64)
    p.begin(prompt, GREEDY, None, 64, runtime.prefill(prompt))
    assert [c.length for c in p.state.caches] == [8, 7, 6]  # positions 0..n - k
    assert rows == [8, 7, 6]  # one call per depth: the prompt fits one chunk
    rows.clear()
    tokens = [*prompt, 5]
    draft = MTPProposer.propose_batch([p], [tokens], [K])[0] if batched else p.propose(tokens, K)
    assert len(draft.tokens) == K
    assert rows == [1, 2, 3]
    assert [c.length for c in p.state.caches] == [9, 8, 7]


@pytest.mark.parametrize("case", list(STEP_CASES))
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_drafts_after_reading_at_begin_equal_reading_in_the_first_draft(mtp_llms, family, case):
    """Reading the prompt at begin only moves work: every later draft (tokens, tree, distributions, generator
    draws) and every depth's cache are bit-identical to those of a proposer whose first draft reads it."""
    tree, temperature, batched = STEP_CASES[case]
    llm = mtp_llms[family][1 if tree else 0]
    prompts = _prompts(llm.model, [11, 4, 1, 2] if batched else [11], seed=1)  # short ones: positions < k
    new = _run_steps(llm, prompts, temperature, batched)
    old = _run_steps(llm, prompts, temperature, batched, read=False)
    _assert_same(*new, *old)


@pytest.mark.parametrize("chunk", [1, 7])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_long_prompt_read_in_chunks_drafts_as_read_in_one_piece(mtp_llms, monkeypatch, shape, chunk):
    """A prompt longer than PROMPT_CHUNK is read a chunk at a time (no prompt x prompt scores), into the
    same bits as in one piece: linears are row-invariant, attention per row reads the masked cache."""
    from specdec.drafting import mtp

    llm = mtp_llms["gemma3_text"][1 if shape == "tree" else 0]
    prompt = _prompts(llm.model, [40], seed=2)
    one = _run_steps(llm, prompt, 0.9, False)
    rows = _block_rows(monkeypatch, llm)
    monkeypatch.setattr(mtp, "PROMPT_CHUNK", chunk)
    chunked = _run_steps(llm, prompt, 0.9, False)
    expect = [min(chunk, n - s) for n in (39, 38, 37) for s in range(0, n, chunk)]
    assert rows[: len(expect)] == expect  # begin: every depth in chunks
    _assert_same(*one, *chunked)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_deeper_depths_read_only_the_last_positions_of_a_long_prompt(mtp_llms, monkeypatch, shape):
    """Depths >= 2 start their caches DEEP_CONTEXT positions before the end of the context: begin reads the
    whole prompt at depth 1 and only its tail deeper, and later drafts are bit-identical to those of a
    proposer whose first draft reads it (the same first positions either way)."""
    from specdec.drafting import mtp

    monkeypatch.setattr(mtp, "DEEP_CONTEXT", 5)
    llm = mtp_llms["gemma3_text"][1 if shape == "tree" else 0]
    prompt = _prompts(llm.model, [40], seed=3)[0]
    rows = _block_rows(monkeypatch, llm)
    p, runtime = llm.new_proposer(), llm.model.new_runtime()
    runtime.reset(64)
    p.begin(prompt, GREEDY, None, 64, runtime.prefill(prompt))
    assert rows == [39, 3, 2]  # depth 1: positions 0..38; depths 2, 3: from 40 - 5 = 35 to 40 - k
    assert p.state.first_positions == [0, 35, 35]
    assert p.state.caches[1].positions[:3].tolist() == [35, 36, 37]
    _assert_same(*_run_steps(llm, [prompt], 0.9, False), *_run_steps(llm, [prompt], 0.9, False, read=False))


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_greedy_equals_plain_decoding_when_deeper_depths_skip_the_prompt(zoo, tmp_path, monkeypatch, shape):
    """Prompts far longer than DEEP_CONTEXT: every output still equals plain decoding."""
    from specdec.drafting import mtp

    monkeypatch.setattr(mtp, "DEEP_CONTEXT", 3)
    target = zoo.load("gemma3_text")
    path = make_random_mtp(target, tmp_path / "d", draft_vocab_size=200, num_modules=2)
    long_prompts = [" ".join(PROMPTS * 4), PROMPTS[2] * 6]
    spec = _same_greedy(target, {"method": "mtp", "model": path, "num_speculative_tokens": 3,
                                 **(TREE if shape == "tree" else {})}, long_prompts)
    assert spec.stats.num_draft_tokens > 0  # drafts were made and verified
