"""confidence_threshold: chains stop after a token the drafter is unsure of, and stay lossless."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specdec import LLM, SamplingParams
from specdec.drafting import confidence, draft_model, eagle3, mtp_batch
from specdec.drafting.confidence import keeps_drafting
from specdec.engine import step as engine_step

from eagle3_helpers import make_random_eagle3
from mtp_helpers import make_random_mtp
from stat_helpers import chi_square_pvalue, sample_token_ids
from test_engine import NUM_SAMPLES, SAMPLING_CASES, small_prompt  # noqa: F401 (fixture)

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,"]
K = 4


def test_keeps_drafting_reads_the_drafted_token_probability():
    logits = torch.tensor([2.0, 0.0, 0.0])  # softmax max ~0.79
    assert keeps_drafting(0.0, logits, None, 0)
    assert keeps_drafting(0.5, logits, None, 0) and not keeps_drafting(0.9, logits, None, 0)
    q = torch.tensor([0.1, 0.6, 0.3])
    assert keeps_drafting(0.5, logits, q, 1) and not keeps_drafting(0.5, logits, q, 2)


def test_threshold_out_of_range_is_refused(zoo, tmp_path):
    path = make_random_eagle3(zoo.load("llama"), tmp_path / "d", draft_vocab_size=200)
    with pytest.raises(ValueError, match="confidence_threshold"):
        LLM(loaded=zoo.load("llama"),
            speculative_config={"method": "eagle3", "model": path, "confidence_threshold": 1.5})


def _config(zoo, tmp_path, method: str) -> tuple[object, dict, object]:
    """(target, speculative config, the module whose keeps_drafting the method calls)"""
    if method == "eagle3":
        target = zoo.load("gemma3_text")
        path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
        return target, {"method": "eagle3", "model": path}, eagle3
    if method == "mtp":
        target = zoo.load("gemma3_text")
        path = make_random_mtp(target, tmp_path / "d", draft_vocab_size=200, num_modules=2)
        return target, {"method": "mtp", "model": path}, mtp_batch  # the engine drafts MTP chains there
    return zoo.load("llama"), {"method": "draft_model", "model": zoo.path("llama_draft")}, draft_model


def _draft_lengths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lengths of the drafts the engine verifies from now on, recorded where every method's drafts pass
    (`_draft_all`), so batched drafting (`propose_batch`) is counted as well as `propose`."""
    lengths: list[int] = []
    draft_all = engine_step._draft_all

    def recording(decoding):
        drafts, seconds = draft_all(decoding)
        lengths.extend(len(d) for d, w in zip(drafts, decoding) if min(w.seq.room, w.draft_limit) > 0)
        return drafts, seconds

    monkeypatch.setattr(engine_step, "_draft_all", recording)
    return lengths


@pytest.mark.parametrize("method", ["eagle3", "mtp", "draft_model"])
def test_greedy_equals_plain_at_any_threshold(zoo, tmp_path, monkeypatch, method):
    target, config, module = _config(zoo, tmp_path, method)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = [LLM(loaded=target).generate(p, params)[0].outputs[0].token_ids for p in PROMPTS]

    # confidences the drafter reports with no threshold; their median splits drafts into mixed lengths
    seen: list[float] = []

    def recording(threshold, logits, q, token):
        seen.append(float(q[token]) if q is not None else float(torch.softmax(logits.float(), -1).max()))
        return confidence.keeps_drafting(threshold, logits, q, token)

    monkeypatch.setattr(module, "keeps_drafting", recording)
    if hasattr(module, "greedy_tops"):  # EAGLE-3's greedy chains: the top probabilities of every row at once
        tops = module.greedy_tops

        def recording_tops(*args):
            out = tops(*args)
            seen.extend(p for _, p in out)
            return out

        monkeypatch.setattr(module, "greedy_tops", recording_tops)
    probe = LLM(loaded=target, speculative_config={**config, "num_speculative_tokens": K})
    full = _draft_lengths(monkeypatch)
    assert [probe.generate(p, params)[0].outputs[0].token_ids for p in PROMPTS] == plain
    assert max(full) == K and seen
    median = float(np.median(seen))

    for threshold, expect in ((median, "mixed"), (0.9999, "one")):
        llm = LLM(loaded=target, speculative_config={**config, "num_speculative_tokens": K,
                                                      "confidence_threshold": threshold})
        lengths = _draft_lengths(monkeypatch)
        assert [llm.generate(p, params)[0].outputs[0].token_ids for p in PROMPTS] == plain
        drafted = [n for n in lengths if n]
        if expect == "one":  # a random drafter is never that sure: one token per step
            assert set(drafted) == {1}
        else:
            assert min(drafted) < K and max(drafted) > 1, sorted(set(drafted))


@pytest.fixture(scope="module")
def exact_tokens_2_to_4(zoo, small_prompt):
    """Exact t=1 distributions of the small-vocabulary model after small_prompt: P(x2, x3) [V, V], P(x4) [V]."""
    runtime = zoo.load("small_vocab").new_runtime()
    vocab = zoo.load("small_vocab").vocab_size

    def probs(context):
        runtime.reset(128)
        return torch.softmax(runtime.forward(context, logit_rows="last").logits[0].double(), -1)

    p1 = probs(small_prompt)
    joint23 = torch.zeros(vocab, vocab, dtype=torch.float64)
    p4 = torch.zeros(vocab, dtype=torch.float64)
    for a in range(vocab):
        pa = p1[a] * probs(small_prompt + [a])
        for b in range(vocab):
            pab = pa[b] * probs(small_prompt + [a, b])
            joint23[b] += pab
            for c in range(vocab):
                p4 += pab[c] * probs(small_prompt + [a, b, c])
    return joint23.numpy(), p4.numpy()


def test_eagle3_sampling_distribution_with_a_threshold(zoo, small_prompt, exact_tokens_2_to_4, tmp_path,  # noqa: F811
                                                       monkeypatch):
    """Tokens 2-3 are drafted as one chain of up to 2, which the threshold cuts at the first one or not."""
    target = zoo.load("small_vocab")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=10, seed=2)
    config = {"method": "eagle3", "model": path, "num_speculative_tokens": 2}
    seen: list[float] = []

    def recording(threshold, logits, q, token):
        seen.append(float(q[token]))
        return confidence.keeps_drafting(threshold, logits, q, token)

    with monkeypatch.context() as m:
        m.setattr(eagle3, "keeps_drafting", recording)
        probe = LLM(loaded=target, speculative_config=config)
        for seed in range(100):
            probe.generate({"prompt_token_ids": small_prompt},
                           SamplingParams(max_tokens=4, seed=seed, ignore_eos=True, **SAMPLING_CASES["t1"]))
    llm = LLM(loaded=target, speculative_config={**config, "confidence_threshold": float(np.median(seen))})
    lengths = _draft_lengths(monkeypatch)
    vocab = llm.model.vocab_size
    samples = sample_token_ids(llm, small_prompt, NUM_SAMPLES, 4, **SAMPLING_CASES["t1"])
    joint23, p4 = exact_tokens_2_to_4
    pairs = np.bincount(samples[:, 1] * vocab + samples[:, 2], minlength=vocab * vocab)
    assert chi_square_pvalue(pairs, joint23) > 1e-4
    assert chi_square_pvalue(np.bincount(samples[:, 3], minlength=vocab), p4) > 1e-4
    assert lengths.count(1) > 200 and lengths.count(2) > 200, (lengths.count(1), lengths.count(2))
    assert llm.stats.num_accepted_tokens >= 100


def test_tree_growth_stops_below_the_threshold():
    from specdec.drafting.dynamic_tree import grow_tree

    vocab = 6
    table = torch.log_softmax(torch.arange(vocab, dtype=torch.float32) * 2.0, -1)  # top token p ~0.86
    calls = []

    def expand(frontier, nodes):
        calls.append(len(frontier))
        return table.expand(len(frontier), vocab).clone()

    assert max(n.depth for n in grow_tree(table, expand, top_k=2, depth=4, total=20)) == 4
    calls.clear()
    # paths: 0.86, 0.86^2 = 0.74, 0.86^3 = 0.64; with 0.7 the third level is never expanded
    nodes = grow_tree(table, expand, top_k=2, depth=4, total=20, min_score=float(np.log(0.7)))
    assert len(calls) == 2 and max(n.depth for n in nodes) == 3


def test_eagle3_tree_with_a_threshold_equals_plain(zoo, tmp_path, monkeypatch):
    target = zoo.load("gemma3_text")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = [LLM(loaded=target).generate(p, params)[0].outputs[0].token_ids for p in PROMPTS]
    config = {"method": "eagle3", "model": path, "num_speculative_tokens": 4, "tree_top_k": 3,
              "tree_num_draft_tokens": 12}
    for threshold in (0.0, 0.3, 0.9999):
        llm = LLM(loaded=target, speculative_config={**config, "confidence_threshold": threshold})
        lengths = _draft_lengths(monkeypatch)
        assert [llm.generate(p, params)[0].outputs[0].token_ids for p in PROMPTS] == plain
        if threshold == 0.0:
            assert max(lengths) == 12
        if threshold == 0.9999:  # never expanded past the root's top_k children
            assert set(lengths) <= {0, 3}
