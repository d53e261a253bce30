"""Tree drafts through the engine: greedy output equals plain decoding, the kept path is committed like a
chain, trees are cut to max_tokens, and sampled output follows the target's distribution."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from specdec import LLM, SamplingParams
from specdec.drafting.base import Draft, Proposer
from specdec.drafting.tree import tree_depths
from specdec.engine.sequence import SequenceState
from specdec.engine.step import Work, run_step
from stat_helpers import chi_square_pvalue, sample_token_ids
from test_engine import (  # noqa: F401  (small_prompt and exact_first_tokens are fixtures)
    MAX_TOKENS,
    NUM_SAMPLES,
    PROMPTS,
    SAMPLING_CASES,
    check_stats,
    exact_first_tokens,
    greedy,
    plain_ids,
    small_prompt,
)
from test_tree_verification import wrong_tree_verifier
from tree_proposers import DraftTreeProposer, ScriptTreeProposer, random_topological_order


def script_llm(zoo, model: str, prompt: str, length: int = MAX_TOKENS, **kwargs) -> LLM:
    llm = LLM(loaded=zoo.load(model))
    script = llm.get_tokenizer()(prompt).input_ids + plain_ids(zoo, model, prompt, length)
    llm.proposer = ScriptTreeProposer(script, llm.model.vocab_size, **kwargs)
    return llm


def assert_paths_follow_the_script(proposer: ScriptTreeProposer) -> None:
    """Each feedback path is a root-to-node path of the proposer's own (uncut) draft whose tokens are what the
    target produced there; path lengths are the accepted counts."""
    trees = [f for f in proposer.feedbacks if f[1] is not None]
    assert len(trees) == len(proposer.drafts)
    # the other steps had no room for a draft (the proposer is not asked, but told 0 were accepted)
    assert all(accepted == 0 for accepted, path, _ in proposer.feedbacks if path is None)
    for (n, _, draft), (accepted, path, verified) in zip(proposer.drafts, trees):
        assert len(path) == accepted
        assert [draft.parents[i] for i in path] == [-1, *path][: len(path)]
        assert [draft.tokens[i] for i in path] == proposer.script[n : n + accepted]
        rows = verified.final_hidden if verified.logits is None else verified.logits  # greedy by slices: no logits
        assert rows is not None and rows.shape[0] == len(draft) + 1


def has_repeated_siblings(draft: Draft) -> bool:
    pairs = list(zip(draft.parents, draft.tokens))
    return len(set(pairs)) < len(pairs)


# --- greedy: identical token ids ---------------------------------------------------------------------------

SHAPES = {"wide": dict(depth=3, width=6), "deep": dict(depth=14, width=1), "bushy": dict(depth=8, width=3)}


@pytest.mark.parametrize("model", ["llama", "gemma_untied", "gemma_dim32", "qwen2_sliding", "mistral"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_random_trees_greedy_equal_plain(zoo, model, shape):
    """Random shapes (deeper than the sliding window, up to 63 nodes), repeated sibling tokens, random node
    order; deep trees are cut near max_tokens."""
    accepted = 0
    for seed, prompt in enumerate(PROMPTS):
        llm = script_llm(zoo, model, prompt, seed=seed, **SHAPES[shape])
        out = llm.generate(prompt, greedy())[0]
        assert out.outputs[0].token_ids == plain_ids(zoo, model, prompt)
        check_stats(out.spec_decoding_stats)
        assert_paths_follow_the_script(llm.proposer)
        accepted += out.spec_decoding_stats.num_accepted_tokens
        drafts = [d for _, _, d in llm.proposer.drafts]
        assert max(len(d) for d in drafts) > 1
        if SHAPES[shape]["width"] > 1:
            assert any(has_repeated_siblings(d) for d in drafts)
    assert accepted > MAX_TOKENS  # most steps keep a path


@pytest.mark.parametrize("model, layers", [("llama", 2), ("gemma_untied", 2), ("llama", 4)])
@pytest.mark.parametrize("top_k, depth", [(2, 5), (4, 3)])
def test_draft_model_top_k_trees_greedy_equal_plain(zoo, model, layers, top_k, depth):
    loaded = zoo.load(model)
    llm = LLM(loaded=loaded)
    llm.proposer = DraftTreeProposer(loaded.new_runtime(num_layers=layers), loaded.vocab_size, top_k, depth)
    for prompt in PROMPTS:
        out = llm.generate(prompt, greedy())[0]
        assert out.outputs[0].token_ids == plain_ids(zoo, model, prompt)
        check_stats(out.spec_decoding_stats)
    if layers == 4:  # the target drafting for itself: its first child is always the argmax
        steps = llm.stats.num_steps
        assert llm.stats.num_accepted_tokens >= (steps - 2 * len(PROMPTS)) * depth


def test_tree_stats_count_nodes_and_kept_paths(zoo):
    llm = script_llm(zoo, "llama", PROMPTS[0], depth=4, width=3, respect_max_tokens=True)
    s = llm.generate(PROMPTS[0], greedy())[0].spec_decoding_stats
    drafts, feedbacks = llm.proposer.drafts, llm.proposer.feedbacks
    assert s.num_draft_tokens == sum(len(d) for _, _, d in drafts)  # nothing was cut: depth <= max_tokens
    assert s.num_accepted_tokens == sum(a for a, _, _ in feedbacks)
    assert all(path is not None for _, path, _ in feedbacks[:-1])
    assert s.num_steps == len(drafts) and s.num_drafts == len(drafts)


# --- commit: the kept path becomes the committed sequence ---------------------------------------------------


class Recorder(Proposer):
    Options = SimpleNamespace

    def __init__(self) -> None:
        super().__init__(SimpleNamespace(num_speculative_tokens=1), target=None)
        self.feedbacks: list[tuple[int, object, list[int] | None]] = []

    draft: Draft | None = None  # what propose returns (set by the test)

    def propose(self, tokens, max_tokens) -> Draft:
        assert self.draft is not None, "not used"
        return self.draft

    def feedback(self, num_accepted, verified=None, path=None) -> None:
        self.feedbacks.append((num_accepted, verified, path))


def decoy_tree(right: list[int], vocab: int, seed: int) -> tuple[Draft, list[int]]:
    """A tree whose target path `right` always sits behind a decoy sibling, and whose decoys have children of
    their own, in a random topological order: the kept path is never a prefix of the forward. Returns the
    draft and the kept path (indices into it)."""
    rng = random.Random(seed)
    tokens, parents, on_path = [], [], []
    node = -1
    for token in right:
        decoy = (token + 1 + rng.randrange(vocab - 1)) % vocab
        tokens += [decoy, token, rng.randrange(vocab)]
        parents += [node, node, len(tokens) - 3]  # the decoy's own child comes third
        node = len(tokens) - 2
        on_path.append(node)
    order, parents = random_topological_order(parents, rng)
    new = {old: j for j, old in enumerate(order)}
    return Draft(tokens=[tokens[i] for i in order], parents=parents), [new[i] for i in on_path]


@pytest.mark.parametrize("model", ["llama", "gemma_untied", "qwen2_sliding"])
def test_tree_step_commits_the_kept_path_like_a_chain(zoo, model):
    """After a tree step the cache holds exactly what forwarding the kept tokens as a chain leaves: the next
    forward's logits are bit-identical (bfloat16 on CPU)."""
    loaded = zoo.load(model)
    prompt = loaded.tokenizer(PROMPTS[0]).input_ids
    out = plain_ids(zoo, model, PROMPTS[0])
    depth, after = 10, [7, 42, 99]  # deeper than the sliding window
    draft, path = decoy_tree(out[1 : depth + 1], loaded.vocab_size, seed=0)
    assert path != list(range(depth))  # the cache must move entries
    runtime = loaded.new_runtime()
    recorder = Recorder()
    seq = SequenceState.create("0", prompt, greedy(), runtime, recorder, loaded.tokenizer, [])
    seq.capacity = 256
    runtime.reset(256)  # the chain below attends over a buffer of the same size
    run_step([Work(seq, chunk=len(prompt))])  # the prefill: its token is out[0]
    recorder.feedbacks.clear()
    recorder.draft = draft
    step = run_step([Work(seq, draft_limit=63)])["0"]
    produced = step.new_token_ids
    assert (seq.stats.num_draft_tokens, produced) == (len(draft), out[1 : depth + 2])
    assert recorder.feedbacks[0][0] == depth and recorder.feedbacks[0][2] == path
    assert runtime.length == len(prompt) + 1 + depth
    continued = runtime.forward([produced[-1], *after]).logits

    chain = loaded.new_runtime()
    chain.reset(256)
    chain.prefill(prompt + out[: depth + 1])
    assert torch.equal(continued, chain.forward([out[depth + 1], *after]).logits)


def test_cut_nodes_get_zero_rows_in_the_proposers_forward(zoo):
    """max_tokens 5 against trees 12 deep: the first step may only keep 3 nodes (the step's own token and the
    prefill's come on top); the proposer still sees rows and path in its own draft's numbering."""
    llm = script_llm(zoo, "llama", PROMPTS[1], depth=12, width=2, hit=1.0, duplicate=0.0)
    out = llm.generate(PROMPTS[1], greedy(5))[0]
    assert out.outputs[0].token_ids == plain_ids(zoo, "llama", PROMPTS[1])[:5]
    (n, room, draft), (accepted, path, verified) = llm.proposer.drafts[0], llm.proposer.feedbacks[0]
    assert path is not None
    assert room == 3 and accepted == 3
    depths = tree_depths(draft.parents)
    cut = [i for i, d in enumerate(depths) if d > room]
    assert cut and all(depths[i] <= room for i in path)
    logits = verified.logits
    if logits is None:  # greedy verification by slices hands the proposer final hidden states only
        logits = llm.runtime.head_logits(verified.final_hidden, slice(0, llm.model.vocab_size))
    assert not logits[[i + 1 for i in cut]].any()
    assert all(logits[i + 1].abs().sum() > 0 for i in range(len(draft)) if i not in cut)
    assert logits[0].argmax() == llm.proposer.script[n]  # rows still line up with the draft
    assert [int(logits[i + 1].argmax()) for i in path] == llm.proposer.script[n + 1 : n + 1 + accepted]
    assert out.spec_decoding_stats.num_draft_tokens < sum(len(d) for _, _, d in llm.proposer.drafts)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 6, 11, 17])
def test_max_tokens_is_exact_with_deep_trees(zoo, max_tokens):
    llm = script_llm(zoo, "llama", PROMPTS[2], depth=12, width=2, hit=0.9)
    out = llm.generate(PROMPTS[2], greedy(max_tokens))[0]
    assert out.outputs[0].token_ids == plain_ids(zoo, "llama", PROMPTS[2])[:max_tokens]
    assert out.outputs[0].finish_reason == "length"
    check_stats(out.spec_decoding_stats)
    assert_paths_follow_the_script(llm.proposer)


def test_stop_token_inside_a_kept_path(zoo):
    ids = plain_ids(zoo, "llama", PROMPTS[2])
    index = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])
    llm = script_llm(zoo, "llama", PROMPTS[2], depth=8, width=3, hit=1.0)
    out = llm.generate(PROMPTS[2], greedy(stop_token_ids=[ids[index]]))[0].outputs[0]
    assert out.token_ids == ids[: index + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", ids[index])


class BigTree(Recorder):
    def propose(self, tokens, max_tokens) -> Draft:
        return Draft(tokens=[5] * 64, parents=[-1] * 64)


def test_a_tree_larger_than_a_forward_is_an_error(zoo):
    llm = LLM(loaded=zoo.load("llama"))
    llm.proposer = BigTree()
    with pytest.raises(RuntimeError, match="tree of 64 nodes, more than 63"):
        llm.generate(PROMPTS[0], greedy())


# --- sampling ----------------------------------------------------------------------------------------------


def tree_llm(zoo, model: str, draft: str, top_k: int, depth: int, sample: bool) -> LLM:
    llm = LLM(loaded=zoo.load(model))

    def new_proposer() -> DraftTreeProposer:
        return DraftTreeProposer(zoo.load(draft).new_runtime(), llm.model.vocab_size, top_k, depth, sample=sample)

    llm.proposer, llm.proposer_factory = new_proposer(), new_proposer  # the factory lets requests run batched
    return llm


def test_seeded_tree_sampling_is_reproducible(zoo):
    llm = tree_llm(zoo, "llama", "llama_draft", top_k=3, depth=3, sample=True)

    def sample(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=20, seed=seed, ignore_eos=True)
        return llm.generate(PROMPTS[0], params)[0].outputs[0].token_ids

    assert sample(1) == sample(1)
    assert len({tuple(sample(seed)) for seed in range(2, 7)}) > 1


def sample_first_tokens(llm: LLM, prompt: list[int], case: str) -> np.ndarray:
    """The first three tokens of NUM_SAMPLES seeded requests (max_tokens 4, so that the first tree may keep a
    path of 2)."""
    warp = SAMPLING_CASES[case]
    return sample_token_ids(llm, prompt, NUM_SAMPLES, 4, **warp)[:, :3]


def first_tokens_pvalues(samples: np.ndarray, exact: tuple[np.ndarray, np.ndarray], vocab: int) -> list[float]:
    """Goodness of fit of the first two tokens' joint, the first's marginal and the third's marginal."""
    joint12, p3 = exact
    return [
        chi_square_pvalue(np.bincount(samples[:, 0] * vocab + samples[:, 1], minlength=vocab * vocab), joint12),
        chi_square_pvalue(np.bincount(samples[:, 0], minlength=vocab), joint12.sum(1)),
        chi_square_pvalue(np.bincount(samples[:, 2], minlength=vocab), p3),
    ]


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
@pytest.mark.parametrize("tree", ["top-k point masses", "i.i.d. samples"])
def test_tree_sampling_distribution_matches_the_target(zoo, small_prompt, exact_first_tokens, case, tree):
    """As test_engine's distribution test, through trees from the 12-token model's draft model: the joint of
    the first two generated tokens and the marginal of the third follow the target exactly."""
    llm = tree_llm(zoo, "small_vocab", "small_vocab_draft", top_k=3, depth=2, sample=tree == "i.i.d. samples")
    samples = sample_first_tokens(llm, small_prompt, case)
    assert min(first_tokens_pvalues(samples, exact_first_tokens[case], llm.model.vocab_size)) > 1e-4
    assert llm.stats.num_accepted_tokens >= 200, llm.stats.num_accepted_tokens  # paths were kept...
    assert llm.stats.num_accepted_tokens < 0.9 * 2 * llm.stats.num_drafts  # ...and rejections happened


def test_the_engine_distribution_test_detects_a_wrong_tree_verifier(
    zoo, small_prompt, exact_first_tokens, monkeypatch
):
    """The test above must be able to fail: with a verifier that resamples the target's p after rejections
    (instead of the residual), the tokens drafted as siblings come out too often."""
    monkeypatch.setattr("specdec.verification.verify_draft.verify_tree_sampling", wrong_tree_verifier("resample_from_p"))
    llm = tree_llm(zoo, "small_vocab", "small_vocab_draft", top_k=3, depth=2, sample=False)
    samples = sample_first_tokens(llm, small_prompt, "t1")
    assert min(first_tokens_pvalues(samples, exact_first_tokens["t1"], llm.model.vocab_size)) < 1e-6
