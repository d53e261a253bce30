"""Batched speculative decoding: batch invariance (as property tests), the continuous-batching scheduler,
chunked prefill, cancellation, and sampling inside a batch."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec import LLM, SamplingParams
from specdec.engine.sequence import cache_capacity
from specdec.models.runtime import ForwardCall, forward_batch
from stat_helpers import chi_square_pvalue
from test_engine import (  # noqa: F401  (small_prompt and exact_first_tokens are fixtures)
    NUM_SAMPLES,
    PROMPTS,
    SAMPLING_CASES,
    exact_first_tokens,
    greedy,
    plain_ids,
    small_prompt,
)

MODELS = ["llama", "gemma_untied", "gemma_dim32", "qwen2_sliding", "wide_llama"]


def random_parents(rng: random.Random, n: int, tree: bool) -> list[int] | None:
    """None (a chain) or a random tree of n rows: each row's parent an earlier row, or -1 (the prefix)."""
    if not tree or n == 1:
        return None
    return [-1] + [rng.randrange(-1, i) for i in range(1, n)]


@st.composite
def batches(draw):
    n = draw(st.integers(1, 5))
    return [
        dict(prompt_len=draw(st.integers(1, 40)), rows=draw(st.integers(1, 12)), tree=draw(st.booleans()),
             capacity=draw(st.sampled_from([128, 256])), seed=draw(st.integers(0, 10**6)))
        for _ in range(n)
    ]


@pytest.mark.parametrize("model", MODELS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches())
def test_a_sequence_gets_the_same_bits_in_any_batch(zoo, model, batch):
    """Random mixes of sequences (prompt lengths, cache sizes, chains and trees of random sizes): every
    sequence's logits, captured hidden states and final hidden states in one batched forward equal its
    forward alone, bit for bit."""
    loaded = zoo.load(model)
    vocab = loaded.vocab_size
    capture = (0, 1, loaded.num_layers)
    alone, together, calls = [], [], []
    for spec in batch:
        rng = random.Random(spec["seed"])
        prompt = [rng.randrange(3, vocab) for _ in range(spec["prompt_len"])]
        call = ForwardCall([rng.randrange(3, vocab) for _ in range(spec["rows"])],
                           random_parents(rng, spec["rows"], spec["tree"]), capture, "all")
        for group in (alone, together):
            runtime = loaded.new_runtime()
            runtime.reset(spec["capacity"])
            runtime.prefill(prompt)
            group.append(runtime)
        calls.append(call)
    expected = [rt.forward(c.tokens, c.parents, c.capture, c.logit_rows) for rt, c in zip(alone, calls)]
    got = forward_batch(together, calls)
    for e, g in zip(expected, got):
        assert torch.equal(e.logits, g.logits)
        assert torch.equal(e.final_hidden, g.final_hidden)
        assert all(torch.equal(e.hidden[i], g.hidden[i]) for i in capture)


def test_a_runtime_reuses_its_kv_memory_for_the_next_sequence(zoo):
    """A released runtime keeps a small cache and the next `reset` reuses its memory, larger or smaller (a
    view of it, zeroed): the next sequence's logits equal a fresh runtime's, bit for bit."""
    loaded = zoo.load("qwen2_sliding")
    reused = loaded.new_runtime()
    reused.reset(256)
    reused.prefill([5, 6, 7, 8, 9] * 20)
    storage = reused.cache.storage_bytes
    reused.release()
    assert reused.cache is not None  # kept: far below KEEP_CACHE_BYTES
    for capacity, prompt in ((128, [3, 4, 5, 6]), (256, [9, 8, 7]), (96, [11, 12])):
        reused.reset(capacity)
        assert reused.cache.capacity == capacity and reused.cache.storage_bytes == storage
        fresh = loaded.new_runtime()
        fresh.reset(capacity)
        got, want = reused.prefill(prompt), fresh.prefill(prompt)
        assert torch.equal(got.logits, want.logits)
        call = ForwardCall([13, 14, 15], [-1, 0, 0], (), "all")
        assert torch.equal(forward_batch([reused], [call])[0].logits, fresh.forward(call.tokens, call.parents).logits)
        reused.release()


def test_a_batch_computes_every_greedy_token_in_one_call(zoo, monkeypatch):
    """ForwardCall(argmax=True): the batch's logit rows go through greedy_argmax once, each sequence gets its
    rows' slice (equal to its own argmax), and greedy verification uses that slice rather than its own."""
    from specdec.models import decoder as decoder_module
    from specdec.verification import TargetRows, verify

    loaded = zoo.load("gemma_untied")
    runtimes, calls = [], []
    for i, rows in enumerate((1, 4, 2)):
        runtime = loaded.new_runtime()
        runtime.reset(128)
        runtime.prefill([5 + i, 9, 11 + i])
        runtimes.append(runtime)
        calls.append(ForwardCall([7 + j for j in range(rows)], argmax=i != 2, logit_rows="all"))
    seen = []
    real = decoder_module.greedy_argmax
    monkeypatch.setattr(decoder_module, "greedy_argmax", lambda x: seen.append(x.shape[0]) or real(x))
    results = forward_batch(runtimes, calls)
    assert seen == [7]  # every row of the batch, once
    for result, call in zip(results, calls):
        if call.argmax:
            assert torch.equal(result.argmax, result.logits.argmax(dim=-1))
        else:
            assert result.argmax is None
    # verification reads the precomputed tokens: a different "argmax" gives a different outcome
    draft = list(results[1].argmax[:-1].tolist())
    true = verify(draft, None, None, TargetRows(logits=results[1].logits, argmax=results[1].argmax),
                  greedy(8), None)
    assert true.num_accepted == len(draft)
    wrong = verify(draft, None, None, TargetRows(logits=results[1].logits, argmax=results[1].argmax + 1),
                   greedy(8), None)
    assert wrong.num_accepted == 0


def test_forward_batch_refuses_a_runtime_twice(zoo):
    runtime = zoo.load("llama").new_runtime()
    runtime.reset(128)
    with pytest.raises(ValueError, match="twice"):
        forward_batch([runtime, runtime], [ForwardCall([5]), ForwardCall([6])])


CONFIGS = {
    "plain": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4},
    "draft_model": {"method": "draft_model", "model": "self:1", "num_speculative_tokens": 3},
    "auto": {"method": "ngram", "num_speculative_tokens": "auto"},
    "by_batch_size": {"method": "ngram", "num_speculative_tokens_by_batch_size": [[1, 2, 4], [3, 64, 1]]},
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("model", ["gemma_untied", "qwen2_sliding"])
def test_batched_generate_equals_batch_one_plain(zoo, model, config):
    """Eight requests of different lengths through 3 slots: requests join as others leave mid-batch, and
    every output equals the request's plain output run alone."""
    loaded = zoo.load(model)
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(8)]
    lengths = [5, 23, 9, 17, 30, 3, 12, 26]
    llm = LLM(loaded=loaded, speculative_config=CONFIGS[config], max_num_seqs=3)
    outs = llm.generate(prompts, [greedy(n) for n in lengths])
    for prompt, n, out in zip(prompts, lengths, outs):
        assert out.outputs[0].token_ids == plain_ids(zoo, model, prompt, n)
    if config not in ("plain",):
        assert llm.stats.num_drafts > 0 or config == "auto"


def test_drafting_steps_charge_their_unexplained_time_to_the_drafter(zoo, monkeypatch):
    """A drafting step with no backlog to catch up reports its time beyond the curve's forward to the auto
    policy (step_overhead): the catch-up call that finds nothing still takes microseconds, and such a step
    must not count as one that caught up (it did for every step once, and DFlash drafted at a loss)."""
    from specdec.scheduling.draft_length import AutoDraftLength

    calls: list[tuple] = []
    original = AutoDraftLength.step_overhead

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(AutoDraftLength, "step_overhead", spy)
    llm = LLM(loaded=zoo.load("gemma_untied"), speculative_config=CONFIGS["auto"])
    llm.generate(["one two three one two three one two three one two three"], greedy(24))
    assert llm.stats.num_drafts > 0 and calls


def test_chunked_prefill_gives_the_one_piece_tokens(zoo):
    """A prompt read in chunks of at most 64 - (decode rows) tokens between other requests' steps equals
    one-piece prefill, for the long prompt and for the requests running beside it."""
    loaded = zoo.load("gemma_untied")
    long_prompt = " ".join(PROMPTS) * 4  # several hundred byte tokens
    prompts = [PROMPTS[0], long_prompt, PROMPTS[1]]
    llm = LLM(loaded=loaded, speculative_config={"method": "ngram", "num_speculative_tokens": 3},
              max_num_seqs=3, max_num_batched_tokens=64)
    outs = llm.generate(prompts, greedy(20))
    assert len(llm.get_tokenizer()(long_prompt).input_ids) > 3 * 64
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == plain_ids(zoo, "gemma_untied", prompt, 20)


def test_running_streams_produce_tokens_during_a_long_prefill(zoo):
    loaded = zoo.load("llama")
    llm = LLM(loaded=loaded, max_num_seqs=2, max_num_batched_tokens=64)
    scheduler = llm.new_scheduler()
    short = scheduler.add(llm.get_tokenizer()(PROMPTS[0]).input_ids, greedy(40))
    scheduler.step()  # the short request is decoding
    long_ids = llm.get_tokenizer()(" ".join(PROMPTS) * 6).input_ids
    long = scheduler.add(long_ids, greedy(5))
    produced_during_prefill = 0
    while True:
        out = scheduler.step()
        if long in out:  # the long prompt's first token: its prefill is over
            break
        produced_during_prefill += len(out[short].new_token_ids)
    assert produced_during_prefill >= len(long_ids) // 64 - 1


def test_a_cancelled_request_leaves_the_others_unchanged(zoo):
    loaded = zoo.load("gemma_untied")
    llm = LLM(loaded=loaded, speculative_config={"method": "ngram", "num_speculative_tokens": 3}, max_num_seqs=4)
    scheduler = llm.new_scheduler()
    tok = llm.get_tokenizer()
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(4)]
    ids = [scheduler.add(tok(p).input_ids, greedy(25)) for p in prompts]
    outputs: dict[str, list[int]] = {i: [] for i in ids}
    for _ in range(3):
        for rid, out in scheduler.step().items():
            outputs[rid] += out.new_token_ids
    assert scheduler.abort(ids[1])
    assert not scheduler.abort("no such request")
    while scheduler.has_unfinished:
        for rid, out in scheduler.step().items():
            assert rid != ids[1]
            outputs[rid] += out.new_token_ids
    for i in (0, 2, 3):
        assert outputs[ids[i]] == plain_ids(zoo, "gemma_untied", prompts[i], 25)
    assert scheduler.kv_in_use == 0


def test_a_request_that_can_never_fit_is_refused_with_the_limit(zoo):
    llm = LLM(loaded=zoo.load("llama"), kv_cache_memory_bytes=1 << 16)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        llm.generate(PROMPTS[0], greedy(1000))
    assert not llm.scheduler.has_unfinished  # nothing of the failed call stays queued


def test_kv_memory_admission_waits_and_still_finishes(zoo):
    loaded = zoo.load("llama")
    tok = loaded.tokenizer
    prompts = [PROMPTS[0] + " " * i for i in range(5)]
    capacities = {cache_capacity(len(tok(p).input_ids), 30) for p in prompts}
    assert len(capacities) == 1
    per_request = capacities.pop() * loaded.kv_bytes_per_token
    llm = LLM(loaded=loaded, max_num_seqs=8, kv_cache_memory_bytes=2 * per_request)
    scheduler = llm.new_scheduler()
    for p in prompts:
        scheduler.add(tok(p).input_ids, greedy(30))
    peak = 0
    while scheduler.has_unfinished:
        scheduler.step()
        peak = max(peak, len(scheduler.running))
        assert scheduler.kv_in_use <= 2 * per_request
    assert peak == 2


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_sampling_inside_a_batch_matches_the_target(zoo, small_prompt, exact_first_tokens, case):
    """As test_engine's distribution test, with every sample a request of one batched generate call (32
    sequences per forward, n-gram drafts verified in the batch)."""
    llm = LLM(loaded=zoo.load("small_vocab"), speculative_config={"method": "ngram", "num_speculative_tokens": 3},
              max_num_seqs=32)
    vocab = llm.model.vocab_size
    params = [SamplingParams(max_tokens=3, seed=seed, ignore_eos=True, **SAMPLING_CASES[case])
              for seed in range(NUM_SAMPLES)]
    outs = llm.generate([{"prompt_token_ids": small_prompt}] * NUM_SAMPLES, params)
    samples = np.array([o.outputs[0].token_ids for o in outs])
    joint12, p3 = exact_first_tokens[case]
    pairs = np.bincount(samples[:, 0] * vocab + samples[:, 1], minlength=vocab * vocab)
    assert chi_square_pvalue(pairs, joint12) > 1e-4
    assert chi_square_pvalue(np.bincount(samples[:, 2], minlength=vocab), p3) > 1e-4
    assert llm.stats.num_accepted_tokens >= 100
    assert llm.stats.acceptance_rate < 0.95


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_draft_model_drafts_every_sequence_in_one_forward_per_step(zoo, temperature):
    """DraftModelProposer.propose_batch gives each sequence the draft its own propose() gives (same tokens,
    same distributions, same generator draws), with one batched draft-model forward per drafting step."""
    from specdec.drafting.draft_model import DraftModelProposer
    from specdec.models import runtime as runtime_module

    loaded = zoo.load("gemma_untied")
    llm = LLM(loaded=loaded, speculative_config={"method": "draft_model", "model": "self:1",
                                                  "num_speculative_tokens": 4})
    params = SamplingParams(temperature=temperature, max_tokens=8)
    contexts = [loaded.tokenizer.encode(p) for p in [*PROMPTS, PROMPTS[0] + " again"]]
    limits = [4, 2] + [4] * (len(contexts) - 2)

    def start() -> list[DraftModelProposer]:
        ps = [llm.new_proposer() for _ in contexts]
        for i, p in enumerate(ps):
            p.begin(contexts[i], params, torch.Generator().manual_seed(i), 256)
        return ps

    alone = [p.propose(c, 4) for p, c in zip(start(), contexts)]
    batched_ps = start()
    assert len({id(p.runtime.decoder) for p in batched_ps}) == 1  # one shared self-draft decoder
    calls = []
    real = runtime_module.forward_batch
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime_module, "forward_batch", lambda rts, cs: calls.append(len(rts)) or real(rts, cs))
        together = DraftModelProposer.propose_batch(batched_ps, contexts, limits)
    assert calls[0] == len(contexts) >= 4 and len(calls) <= 4  # every sequence in the first forward
    for i, (a, b) in enumerate(zip(alone, together)):
        n = 2 if i == 1 else len(a.tokens)
        assert b.tokens == a.tokens[:n] and len(b.tokens) == min(len(a.tokens), 2 if i == 1 else 4)
        if temperature > 0:
            assert torch.equal(b.probs, a.probs[:n])
        else:
            assert b.probs is None and a.probs is None


@pytest.mark.parametrize("method", ["eagle3", "mtp", "medusa", "dflash"])
def test_running_sequences_share_one_copy_of_the_drafter(zoo, tmp_path, method):
    """Each running sequence has its own proposer, but not its own copy of the weights; a drafter rewritten in
    its folder is loaded anew, and the batch still decodes exactly as plain decoding."""
    from eagle3_helpers import make_random_eagle3
    from medusa_helpers import make_random_medusa
    from mtp_helpers import make_random_mtp
    from test_dflash import make_random_dflash

    target = zoo.load("gemma3_text")
    make = {"eagle3": make_random_eagle3, "mtp": make_random_mtp, "medusa": make_random_medusa,
            "dflash": make_random_dflash}[method]
    path = make(target, tmp_path / "d", draft_vocab_size=200)
    llm = LLM(loaded=target, speculative_config={"method": method, "model": path}, max_num_seqs=3)
    weights = "heads" if method == "medusa" else "drafter"
    first, second = getattr(llm.proposer, weights), getattr(llm.new_proposer(), weights)
    assert first is second and llm.new_proposer() is not llm.proposer
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [[1, 2, 3, 4], [9, 8, 7], [5, 5, 6, 7, 8]]
    plain = [o.outputs[0].token_ids for o in LLM(loaded=target).generate([{"prompt_token_ids": p} for p in prompts],
                                                                           params)]
    assert [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)] == plain
    assert llm.stats.num_draft_tokens > 0
    make(target, tmp_path / "d", draft_vocab_size=200, seed=1)
    assert getattr(llm.new_proposer(), weights) is not first


# prompts for the drafters' propose_batch tests, and each one's pending first token
DRAFT_CONTEXTS = [[1, 2, 3, 4], [9, 8, 7], [5, 5, 6, 7, 8, 9, 10], [4, 3]]
DRAFT_TOKENS = [[*c, 11] for c in DRAFT_CONTEXTS]


def begun_proposers(llm: LLM, params: SamplingParams) -> list:
    """A fresh proposer per DRAFT_CONTEXTS prompt, begun on the target's prefill of it (with the hidden
    states it asks for) and its own seeded generator."""
    target = llm.model
    ps = [llm.new_proposer() for _ in DRAFT_CONTEXTS]
    for i, (p, c) in enumerate(zip(ps, DRAFT_CONTEXTS)):
        runtime = target.new_runtime()
        runtime.reset(64)
        p.begin(c, params, torch.Generator().manual_seed(i), 64, runtime.prefill(c, capture=p.target_layers))
    return ps


def eagle3_alone_and_batched(llm: LLM, params: SamplingParams, limits: list[int]):
    """Each DRAFT_TOKENS prompt's EAGLE-3 draft by its own propose(), and by one propose_batch over fresh
    proposers; returns (alone, batched proposers, batched drafts, rows of each drafter step_batch call)."""
    from specdec.drafting.eagle3 import Eagle3Proposer

    alone = [p.propose(t, m) for p, t, m in zip(begun_proposers(llm, params), DRAFT_TOKENS, limits)]
    batched = begun_proposers(llm, params)
    rows: list[int] = []
    real = type(batched[0].drafter).step_batch
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(batched[0].drafter), "step_batch",
                   lambda self, h, *a: rows.append(h.shape[0]) or real(self, h, *a))
        together = Eagle3Proposer.propose_batch(batched, DRAFT_TOKENS, limits)
    return alone, batched, together, rows


@pytest.mark.parametrize("temperature,threshold", [(0.0, 0.0), (0.9, 0.0), (0.0, 0.2)])
def test_eagle3_drafts_every_chain_in_one_drafter_step_per_position(zoo, tmp_path, temperature, threshold):
    """Eagle3Proposer.propose_batch gives each sequence the chain its own propose() gives (same tokens, same
    distributions, same generator draws), with one batched drafter step per drafted position."""
    from eagle3_helpers import make_random_eagle3

    target = zoo.load("gemma3_text")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    llm = LLM(loaded=target, speculative_config={"method": "eagle3", "model": path, "num_speculative_tokens": 5,
                                                  "confidence_threshold": threshold})
    params = SamplingParams(temperature=temperature, max_tokens=8)
    contexts, limits = DRAFT_CONTEXTS, [5, 2, 5, 0]
    alone, batched, together, rows = eagle3_alone_and_batched(llm, params, limits)
    # every prompt read in one step (begin reads nothing; prompts this short need no catching up), then one
    # step per drafted position for every chain still going (limits 5, 2, 5, 0: the 2-token chain needs one)
    assert rows[0] == sum(len(c) for c in contexts) and len(rows) <= 5
    assert threshold > 0 or rows[1:] == [3, 2, 2, 2]
    assert [len(d.tokens) for d in alone][3] == 0
    for a, b in zip(alone, together):
        assert b.tokens == a.tokens
        assert (a.probs is None and b.probs is None) or torch.equal(a.probs, b.probs)
    assert all(p.cache.length == len(c) for p, c in zip(batched, contexts))  # drafted entries rolled back


@pytest.mark.parametrize("threshold", [0.0, 0.02])
def test_eagle3_grows_every_tree_with_one_drafter_step_per_level(zoo, tmp_path, threshold):
    """Eagle3Proposer.propose_batch grows each sequence's dynamic tree exactly as its own propose() does (same
    tokens, same parents), with one batched drafter step per tree level for every tree still growing."""
    from eagle3_helpers import make_random_eagle3

    target = zoo.load("gemma3_text")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    llm = LLM(loaded=target, speculative_config={"method": "eagle3", "model": path, "num_speculative_tokens": 4,
                                                  "tree_top_k": 3, "tree_num_draft_tokens": 8,
                                                  "confidence_threshold": threshold})
    params = SamplingParams(temperature=0.0, max_tokens=8)
    limits = [4, 2, 4, 0]
    alone, batched, together, rows = eagle3_alone_and_batched(llm, params, limits)
    # one step reads every prompt (short: no catching up); then per level 2..depth one step for the 3 frontier
    # nodes of every tree still growing (depth 4, 2, 4, 0: levels 2-4 for two trees, level 2 for one)
    assert rows[0] == sum(len(c) for c in DRAFT_CONTEXTS)
    assert threshold > 0 or rows[1:] == [9, 6, 6]
    for a, b in zip(alone, together):
        assert b.tokens == a.tokens and b.parents == a.parents
    assert not together[3].tokens and max(max(d.parents or [], default=-1) for d in together) >= 0  # real trees
    assert all(p.cache.length == len(c) for p, c in zip(batched, DRAFT_CONTEXTS))  # drafted entries rolled back


@pytest.mark.parametrize("own_lm_heads,tree_top_k", [(False, None), (True, None), (False, 3)])
def test_medusa_drafts_every_sequence_with_one_call_per_head(zoo, tmp_path, own_lm_heads, tree_top_k):
    """MedusaProposer.propose_batch gives each sequence the tree its own propose() gives, with every
    sequence's hidden state through each head in one call."""
    from medusa_helpers import make_random_medusa
    from specdec.drafting.medusa import MedusaProposer

    target = zoo.load("gemma3_text")
    path = make_random_medusa(target, tmp_path / "d", draft_vocab_size=200, own_lm_heads=own_lm_heads)
    config = {"method": "medusa", "model": path, "tree_num_draft_tokens": 8}
    if tree_top_k:
        config["tree_top_k"] = tree_top_k
    llm = LLM(loaded=target, speculative_config=config)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    tokens, limits = DRAFT_TOKENS, [3, 1, 3, 0]
    alone = [p.propose(t, m) for p, t, m in zip(begun_proposers(llm, params), tokens, limits)]
    batched = begun_proposers(llm, params)
    calls: list[int] = []
    heads = batched[0].heads
    real = type(heads).head_state
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(heads), "head_state", lambda self, k, h: calls.append(h.shape[0]) or real(self, k, h))
        together = MedusaProposer.propose_batch(batched, tokens, limits)
    assert calls == [3] * heads.config.num_heads  # the three sequences with room, each head once
    assert len(alone[3].tokens) == 0 and len(alone[0].tokens) > len(alone[1].tokens) > 0
    for a, b in zip(alone, together):
        assert b.tokens == a.tokens and b.parents == a.parents


@pytest.mark.parametrize("temperature,threshold", [(0.0, 0.0), (0.9, 0.0), (0.0, 0.2)])
def test_mtp_drafts_every_chain_with_one_block_call_per_depth(zoo, tmp_path, temperature, threshold):
    """MTPProposer.propose_batch gives each sequence the chain its own propose() gives (same tokens, same
    distributions, same generator draws, same caches after), with one block call per depth for all chains."""
    from mtp_helpers import make_random_mtp
    from specdec.drafting.mtp import MTPProposer

    target = zoo.load("gemma3_text")
    path = make_random_mtp(target, tmp_path / "d", draft_vocab_size=200)
    llm = LLM(loaded=target, speculative_config={"method": "mtp", "model": path, "num_speculative_tokens": 4,
                                                  "confidence_threshold": threshold})
    params = SamplingParams(temperature=temperature, max_tokens=8)
    tokens, limits = DRAFT_TOKENS, [4, 2, 4, 0]
    alone_ps = begun_proposers(llm, params)
    alone = [p.propose(t, m) for p, t, m in zip(alone_ps, tokens, limits)]
    batched = begun_proposers(llm, params)
    calls: list[int] = []
    block = batched[0].drafter.module_for(1).block
    real = type(block).forward_batch
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(block), "forward_batch", lambda self, h, *a: calls.append(h.shape[0]) or real(self, h, *a))
        together = MTPProposer.propose_batch(batched, tokens, limits)
    assert calls[0] == 3  # depth 1: every drafting sequence's last prompt position (begin read the others)
    assert len(calls) <= 4
    assert len(alone[3].tokens) == 0 and len(alone[0].tokens) > 0
    for a, b, pa, pb in zip(alone, together, alone_ps, batched):
        assert b.tokens == a.tokens
        assert (a.probs is None and b.probs is None) or torch.equal(a.probs, b.probs)
        assert [c.length for c in pa.state.caches] == [c.length for c in pb.state.caches]
        assert all(torch.equal(x, y) for x, y in zip(pa.state.last_logits, pb.state.last_logits))


def test_mtp_grows_every_tree_with_one_block_call_per_level(zoo, tmp_path):
    """MTPProposer.propose_batch grows each sequence's tree exactly as its own propose() does (same tokens,
    parents and caches after), running each level's block once for every tree still growing."""
    from mtp_helpers import make_random_mtp
    from specdec.drafting.mtp import MTPProposer

    target = zoo.load("gemma3_text")
    path = make_random_mtp(target, tmp_path / "d", draft_vocab_size=200)
    llm = LLM(loaded=target, speculative_config={"method": "mtp", "model": path, "num_speculative_tokens": 4,
                                                  "tree_top_k": 3, "tree_num_draft_tokens": 8})
    params = SamplingParams(temperature=0.0, max_tokens=8)
    limits = [4, 2, 4, 0]
    counts: dict[str, list[int]] = {"alone": [], "batched": []}
    alone_ps, batched = begun_proposers(llm, params), begun_proposers(llm, params)
    block = batched[0].drafter.module_for(1).block
    real = type(block).forward_batch
    with pytest.MonkeyPatch.context() as mp:
        mode = "alone"
        mp.setattr(type(block), "forward_batch",
                   lambda self, h, *a: counts[mode].append(h.shape[0]) or real(self, h, *a))
        alone = [p.propose(t, m) for p, t, m in zip(alone_ps, DRAFT_TOKENS, limits)]
        mode = "batched"
        together = MTPProposer.propose_batch(batched, DRAFT_TOKENS, limits)
    assert max(max(d.parents or [], default=-1) for d in alone) >= 0  # real trees
    # alone: every tree runs its own block per level; together: one run per level (plus the empty draft's)
    assert len(counts["batched"]) < len(counts["alone"]) and len(counts["batched"]) <= 4 + 1
    for a, b, pa, pb in zip(alone, together, alone_ps, batched):
        assert b.tokens == a.tokens and b.parents == a.parents
        assert [c.length for c in pa.state.caches] == [c.length for c in pb.state.caches]


DFLASH_SHAPES = {"chain": {}, "threshold": {"confidence_threshold": 0.3},
                 "tree": {"tree_top_k": 3, "tree_num_draft_tokens": 12}}


def first_child_path(draft, depth: int) -> list[int]:
    """Draft indices of a root-to-node path of at most `depth` nodes (a tree's first children, a chain's prefix)."""
    parents = draft.parents if draft.parents is not None else list(range(-1, len(draft) - 1))
    path: list[int] = []
    while len(path) < depth:
        kids = [i for i, q in enumerate(parents) if q == (path[-1] if path else -1)]
        if not kids:
            break
        path.append(kids[0])
    return path


@pytest.mark.parametrize("shape", list(DFLASH_SHAPES))
def test_dflash_drafts_every_sequence_in_one_block_forward(zoo, tmp_path, shape):
    """DFlashProposer.propose_batch gives each sequence the draft its own propose() gives (same tokens, same
    tree, same context cache after), with one drafter block forward for every sequence with room and one
    context projection for the positions the last verifications committed."""
    from specdec.drafting.dflash import DFlashProposer
    from test_dflash import make_random_dflash

    target = zoo.load("gemma3_text")
    path = make_random_dflash(target, tmp_path / "d", draft_vocab_size=200)
    llm = LLM(loaded=target, speculative_config={"method": "dflash", "model": path, "num_speculative_tokens": 5,
                                                  **DFLASH_SHAPES[shape]})
    params = SamplingParams(temperature=0.0, max_tokens=8)
    alone_ps, batched = begun_proposers(llm, params), begun_proposers(llm, params)
    drafter = type(batched[0].drafter)
    real_blocks, real_context = drafter.blocks_batch, drafter.context
    tokens = [list(t) for t in DRAFT_TOKENS]
    for limits in ([5, 0, 4, 3], [2, 5, 0, 5]):  # the second round first ingests what the first one verified
        alone = [p.propose(t, m) for p, t, m in zip(alone_ps, tokens, limits)]
        pending = sum(p.pending.shape[0] for p in batched if p.pending is not None)
        blocks: list[int] = []
        contexts: list[int] = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(drafter, "blocks_batch",
                       lambda self, t, *a, **k: blocks.append(t.shape[0]) or real_blocks(self, t, *a, **k))
            mp.setattr(drafter, "context", lambda self, f: contexts.append(f.shape[0]) or real_context(self, f))
            together = DFlashProposer.propose_batch(batched, tokens, limits)
        assert blocks == [3]  # the three sequences with room, in one forward
        assert contexts == ([pending] if pending else [])  # round 2: every verified row (begin ingested the prompts)
        assert len(alone[limits.index(0)]) == 0
        if shape == "chain":
            assert [len(d) for d in alone] == limits
        elif shape == "threshold":
            assert any(0 < len(d) < m for d, m in zip(alone, limits))
        else:
            assert all(d.parents is not None and len(d) > m for d, m in zip(alone, limits) if m > 1)
        for a, b in zip(alone, together):
            assert b.tokens == a.tokens and b.parents == a.parents and a.probs is None and b.probs is None
        for pa, pb in zip(alone_ps, batched):
            assert pb.cache.length == pa.cache.length and pb.pending is None and pb.vocab.seen == pa.vocab.seen
            assert torch.equal(pb.cache.k, pa.cache.k) and torch.equal(pb.cache.v, pa.cache.v)
        for i, (d, pa, pb) in enumerate(zip(alone, alone_ps, batched)):  # verify a path of each, feed both back
            runtime = target.new_runtime()
            runtime.reset(64)
            runtime.prefill(tokens[i][:-1])
            parents = None if d.parents is None else [-1, *(q + 1 for q in d.parents)]
            verified = runtime.forward([tokens[i][-1], *d.tokens], parents=parents, capture=pa.target_layers)
            kept = first_child_path(d, 2)
            for p in (pa, pb):
                p.feedback(len(kept), verified, kept if d.parents is not None else None)
            tokens[i] += [*(d.tokens[j] for j in kept), 7]
