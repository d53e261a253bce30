"""End to end through `LLM`: speculative output equals plain output (greedy), has the same distribution
(sampling), stops where plain decoding stops, and reports consistent statistics."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from specdec import LLM, SamplingParams
from specdec.drafting.base import Draft, Proposer
from specdec.engine import step as engine_step
from specdec.verification import sampling_probs
from stat_helpers import chi_square_pvalue, sample_token_ids

PROMPTS = [
    "the cat sat on the mat. the cat sat on the mat. the cat",
    "abcabcabcabcabcabc",
    "hello world",
]
MAX_TOKENS = 40


def greedy(max_tokens: int = MAX_TOKENS, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


_plain_cache: dict[tuple, list[int]] = {}


def plain_ids(zoo, model: str, prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    key = (model, prompt, max_tokens)
    if key not in _plain_cache:
        out = LLM(loaded=zoo.load(model)).generate(prompt, greedy(max_tokens))[0].outputs[0]
        assert out.finish_reason == "length" and len(out.token_ids) == max_tokens
        _plain_cache[key] = out.token_ids
    return _plain_cache[key]


def check_stats(s, finished_by_length: bool = True) -> None:
    """Invariants every request's statistics must satisfy."""
    assert s.num_requests == 1
    assert 0 <= s.num_accepted_tokens <= s.num_draft_tokens
    assert s.num_drafts <= s.num_steps
    assert sum(s.accepted_per_position) == s.num_accepted_tokens
    # a chain drafts one token per position; a tree counts its depth there and may hold more nodes
    assert sum(s.drafted_per_position) <= s.num_draft_tokens
    assert all(a <= d for a, d in zip(s.accepted_per_position, s.drafted_per_position))
    assert all(x >= y for x, y in zip(s.drafted_per_position, s.drafted_per_position[1:]))
    assert all(x >= y for x, y in zip(s.accepted_per_position, s.accepted_per_position[1:]))
    assert len(s.accepted_per_position) <= len(s.drafted_per_position)
    if s.num_steps:
        assert s.mean_acceptance_length == pytest.approx((s.num_accepted_tokens + s.num_steps) / s.num_steps)
    else:  # max_tokens 1: the prefill's token only
        assert s.mean_acceptance_length == 0.0 and s.num_draft_tokens == 0
    if s.num_draft_tokens:
        assert s.acceptance_rate == pytest.approx(s.num_accepted_tokens / s.num_draft_tokens)
    if finished_by_length:  # one token from the prefill, then accepted + 1 per step, none cut off
        assert s.num_generated_tokens == 1 + s.num_steps + s.num_accepted_tokens


def run(zoo, model: str, config, prompt: str, params: SamplingParams | None = None):
    llm = LLM(loaded=zoo.load(model), speculative_config=config)
    return llm.generate(prompt, params or greedy())[0]


# --- greedy: identical token ids ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["llama", "bigram", "gemma_untied"])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("lookup", [(1, 4), (2, 2), (3, 5)])
def test_ngram_greedy_equals_plain(zoo, model, k, lookup):
    config = {"method": "ngram", "num_speculative_tokens": k}
    config.update(prompt_lookup_min=lookup[0], prompt_lookup_max=lookup[1])
    drafted = 0
    for prompt in PROMPTS:
        out = run(zoo, model, config, prompt)
        assert out.outputs[0].token_ids == plain_ids(zoo, model, prompt)
        check_stats(out.spec_decoding_stats)
        drafted += out.spec_decoding_stats.num_draft_tokens
    if model == "bigram" or lookup[0] == 1:  # the bigram model's output cycles; 1-grams match the random outputs
        assert drafted > 0


@pytest.mark.parametrize(
    "model, draft", [("llama", "llama_draft"), ("gemma_untied", "gemma_draft"), ("llama", "llama")]
)
@pytest.mark.parametrize("k", [2, 5])
def test_draft_model_greedy_equals_plain(zoo, model, draft, k):
    config = {"method": "draft_model", "model": zoo.path(draft), "num_speculative_tokens": k}
    llm = LLM(loaded=zoo.load(model), speculative_config=config)
    for prompt in PROMPTS:
        out = llm.generate(prompt, greedy())[0]
        assert out.outputs[0].token_ids == plain_ids(zoo, model, prompt)
        check_stats(out.spec_decoding_stats)
    if draft == model:  # the target drafting for itself: every draft token is accepted
        assert llm.stats.acceptance_rate > 0.95
    elif model == "llama":  # an unrelated random model almost never guesses the target's argmax
        assert llm.stats.acceptance_rate < 0.3
    assert llm.stats.num_requests == len(PROMPTS)


@pytest.mark.parametrize("model", ["llama", "gemma_untied", "qwen2_sliding"])
@pytest.mark.parametrize("layers", [1, 2, 3, 4])
def test_self_draft_greedy_equals_plain(zoo, model, layers):
    config = {"method": "draft_model", "model": f"self:{layers}", "num_speculative_tokens": 4}
    llm = LLM(loaded=zoo.load(model), speculative_config=config)
    for prompt in PROMPTS:
        out = llm.generate(prompt, greedy())[0]
        assert out.outputs[0].token_ids == plain_ids(zoo, model, prompt)
        check_stats(out.spec_decoding_stats)
    if layers == 4:  # all layers: the drafter is the target
        assert llm.stats.acceptance_rate > 0.95
        assert llm.stats.mean_acceptance_length > 4.5


def test_draft_model_with_a_smaller_embedding_table(zoo, tmp_path):
    """Same tokenizer, but the draft's vocab_size is not padded (259 rows, the target has 272)."""
    from tiny_models import make_tiny_model

    path = make_tiny_model(tmp_path / "draft259", "llama", num_layers=1, seed=9, vocab_size=259)
    out = run(zoo, "llama", {"method": "draft_model", "model": path, "num_speculative_tokens": 3}, PROMPTS[0])
    assert out.outputs[0].token_ids == plain_ids(zoo, "llama", PROMPTS[0])


def test_ngram_accepts_most_drafts_on_repetitive_output(zoo):
    """The bigram model soon cycles (period 9 here); the n-gram drafter then predicts the whole cycle."""
    out = run(zoo, "bigram", {"method": "ngram", "num_speculative_tokens": 8}, "hello world", greedy(64))
    ids = out.outputs[0].token_ids
    assert any(ids[20:40] == ids[20 + period : 40 + period] for period in range(5, 12))  # really periodic
    s = out.spec_decoding_stats
    assert s.acceptance_rate > 0.9
    assert s.mean_acceptance_length > 3.0
    assert s.num_steps < 64 / 3
    check_stats(s)


def test_plain_decoding_stats(zoo):
    out = run(zoo, "llama", None, PROMPTS[0], greedy(10))
    s = out.spec_decoding_stats
    assert (s.num_steps, s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (9, 0, 0, 0)
    assert s.mean_acceptance_length == 1.0 and s.acceptance_rate == 0.0
    assert s.num_generated_tokens == 10 and s.num_prompt_tokens == len(out.prompt_token_ids)
    check_stats(s)


def test_verification_time_counts_the_head_scored_in_verify(zoo, monkeypatch):
    """A lone greedy sequence scores the head inside verify() (head_max, row by row), after the forward:
    that time is verification time too, so a slowed verify() must show in verify_seconds."""
    real = engine_step.verify

    def slow_verify(*args, **kwargs):
        time.sleep(0.02)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_step, "verify", slow_verify)
    s = run(zoo, "llama", None, PROMPTS[0], greedy(6)).spec_decoding_stats
    assert s.num_steps == 5 and s.verify_seconds >= 5 * 0.02
    check_stats(s)


def test_llm_stats_aggregate_requests(zoo):
    llm = LLM(loaded=zoo.load("bigram"), speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    outs = llm.generate(PROMPTS, greedy())
    per_request = [o.spec_decoding_stats for o in outs]
    assert llm.stats.num_requests == len(PROMPTS)
    for name in ("num_steps", "num_draft_tokens", "num_accepted_tokens", "num_generated_tokens", "num_prompt_tokens"):
        assert getattr(llm.stats, name) == sum(getattr(s, name) for s in per_request)
    for name in ("accepted_per_position", "drafted_per_position"):
        width = max(len(getattr(s, name)) for s in per_request)
        padded = [getattr(s, name) + [0] * (width - len(getattr(s, name))) for s in per_request]
        assert getattr(llm.stats, name) == [sum(column) for column in zip(*padded)]


def test_token_id_prompts_and_per_prompt_params(zoo):
    llm = LLM(loaded=zoo.load("llama"), speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    ids = llm.get_tokenizer()(PROMPTS[0]).input_ids
    outs = llm.generate([{"prompt_token_ids": ids}, PROMPTS[1]], [greedy(), greedy(5)])
    assert outs[0].outputs[0].token_ids == plain_ids(zoo, "llama", PROMPTS[0])
    assert outs[0].prompt_token_ids == ids and outs[0].prompt is None
    assert outs[1].outputs[0].token_ids == plain_ids(zoo, "llama", PROMPTS[1])[:5]
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate([PROMPTS[0]], [greedy(), greedy()])
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate({"prompt_token_ids": [1, 99999]})


# --- scripted drafts: EOS, max_tokens and stop strings inside a draft --------------------------------------


class ScriptedProposer(Proposer):
    """Drafts the continuation of a known token sequence (the target's own greedy output, so every draft
    token is accepted), optionally replacing draft tokens at some positions to force rejections."""

    Options = SimpleNamespace

    def __init__(self, script: Sequence[int], k: int, corrupt_every: int = 0, ignore_max_tokens: bool = False):
        super().__init__(SimpleNamespace(num_speculative_tokens=k), target=None)
        self.script, self.k = list(script), k
        self.corrupt_every, self.ignore_max_tokens = corrupt_every, ignore_max_tokens
        self.calls: list[tuple[int, int]] = []  # (len(tokens), max_tokens) per propose call

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        self.calls.append((len(tokens), max_tokens))
        n = len(tokens)
        assert list(tokens) == self.script[:n], "the target left the script"
        k = self.k if self.ignore_max_tokens else min(self.k, max_tokens)
        draft = self.script[n : n + k]
        if self.corrupt_every:
            draft = [(t + 1) % 256 if (n + i) % self.corrupt_every == 0 else t for i, t in enumerate(draft)]
        return Draft(tokens=draft)


def scripted_llm(zoo, model: str, prompt: str, k: int, length: int = 30, **kwargs):
    llm = LLM(loaded=zoo.load(model))
    ids = llm.get_tokenizer()(prompt).input_ids
    script = ids + plain_ids(zoo, model, prompt, length)
    llm.proposer = ScriptedProposer(script, k, **kwargs)
    return llm


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 9, 10, 11, 17])
@pytest.mark.parametrize("corrupt_every", [0, 4])
def test_max_tokens_is_exact_when_drafts_are_long(zoo, max_tokens, corrupt_every):
    llm = scripted_llm(zoo, "llama", PROMPTS[2], k=8, corrupt_every=corrupt_every)
    out = llm.generate(PROMPTS[2], greedy(max_tokens))[0]
    c = out.outputs[0]
    assert c.token_ids == plain_ids(zoo, "llama", PROMPTS[2], 30)[:max_tokens]
    assert c.finish_reason == "length" and c.stop_reason is None
    prompt_len = len(out.prompt_token_ids)
    for tokens_len, room in llm.proposer.calls:  # the proposer is asked for no more than still fits
        assert 1 <= room == max_tokens - (tokens_len - prompt_len) - 1
    if max_tokens == 1:
        assert llm.proposer.calls == []
    check_stats(out.spec_decoding_stats)
    if corrupt_every == 0 and max_tokens > 2:  # (max_tokens 2: the one step has no room for a draft)
        assert out.spec_decoding_stats.acceptance_rate == 1.0


def test_a_proposer_exceeding_max_tokens_is_an_error(zoo):
    llm = scripted_llm(zoo, "llama", PROMPTS[2], k=8, ignore_max_tokens=True)
    with pytest.raises(RuntimeError, match="more than the 3 allowed"):
        llm.generate(PROMPTS[2], greedy(5))


def first_new_token_index(ids: list[int], start: int) -> int:
    """Index of the first token at or after `start` whose value does not occur earlier in `ids`."""
    for i in range(start, len(ids)):
        if ids[i] not in ids[:i]:
            return i
    raise AssertionError("no suitable token")


@pytest.fixture(scope="module")
def eos_model(zoo, tmp_path_factory):
    """The llama tiny model with an extra EOS id: a token its greedy output for PROMPTS[2] produces at index >= 5."""
    ids = plain_ids(zoo, "llama", PROMPTS[2], 30)
    index = first_new_token_index(ids, 5)
    assert index < 8 and 2 not in ids[: index + 1]  # inside the first 8-token draft; no real EOS before it
    folder = tmp_path_factory.mktemp("eos_model") / "llama_eos"
    shutil.copytree(zoo.path("llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = [2, ids[index]]
    (folder / "config.json").write_text(json.dumps(config))
    from specdec.models.loading import load_model

    return load_model(str(folder), dtype="bfloat16", device="cpu"), ids, index


@pytest.mark.parametrize("proposer", ["plain", "scripted", "corrupted", "ngram", "self:4"])
def test_eos_inside_a_draft_ends_the_output_there(zoo, eos_model, proposer):
    loaded, ids, index = eos_model
    eos = ids[index]
    config = {"method": "draft_model", "model": "self:4", "num_speculative_tokens": 8} if proposer == "self:4" else None
    config = {"method": "ngram", "num_speculative_tokens": 8} if proposer == "ngram" else config
    llm = LLM(loaded=loaded, speculative_config=config)
    assert eos in llm.eos_token_ids
    if proposer in ("scripted", "corrupted"):
        prompt_ids = llm.get_tokenizer()(PROMPTS[2]).input_ids
        llm.proposer = ScriptedProposer(prompt_ids + ids, k=8, corrupt_every=3 if proposer == "corrupted" else 0)
    out = llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    assert out.token_ids == ids[: index + 1]  # EOS is kept in token_ids, as vLLM does
    assert out.finish_reason == "stop" and out.stop_reason == eos
    assert out.text == llm.get_tokenizer().decode(ids[:index], skip_special_tokens=True)
    if proposer in ("scripted", "self:4"):
        # the first draft (output positions 1..8) held the EOS at `index` and accepted tokens after it
        assert llm.stats.num_accepted_tokens >= 8 > index


def test_stop_token_ids_inside_a_draft(zoo):
    ids = plain_ids(zoo, "llama", PROMPTS[2], 30)
    index = first_new_token_index(ids, 4)
    llm = scripted_llm(zoo, "llama", PROMPTS[2], k=8)
    out = llm.generate(PROMPTS[2], greedy(30, stop_token_ids=[ids[index]]))[0].outputs[0]
    assert out.token_ids == ids[: index + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", ids[index])
    assert out.text == llm.get_tokenizer().decode(ids[:index], skip_special_tokens=True)  # stop token left out


def ascii_stop_string(tokenizer, ids: list[int], min_index: int) -> tuple[str, int, str]:
    """An ASCII stop string cut from the decoded output (two characters if possible), whose first occurrence is
    completed by token `end - 1` >= min_index; and the text that must remain: everything before it."""

    def decode(part):
        return tokenizer.decode(part, skip_special_tokens=True)

    text = decode(ids)
    for width in (2, 1):
        for i in range(min_index, len(ids) - width + 1):
            candidate = decode(ids[i : i + width])
            if len(candidate) == width and candidate.isascii() and (candidate.isprintable() or candidate.isspace()):
                end = next(n for n in range(1, len(ids) + 1) if candidate in decode(ids[:n]))
                if end - 1 >= min_index:
                    return candidate, end, text[: text.index(candidate)]
    raise AssertionError("no ASCII window in the output")


@pytest.mark.parametrize("model", ["llama", "bigram"])
@pytest.mark.parametrize("proposer", ["plain", "scripted", "ngram", "self:2"])
def test_stop_string_inside_an_accepted_draft(zoo, model, proposer):
    prompt = PROMPTS[2]
    ids = plain_ids(zoo, model, prompt, 30)
    llm = LLM(loaded=zoo.load(model))
    stop, end, text = ascii_stop_string(llm.get_tokenizer(), ids, min_index=3)
    if proposer == "scripted":
        llm = scripted_llm(zoo, model, prompt, k=8)
    elif proposer == "ngram":
        llm = LLM(loaded=zoo.load(model), speculative_config={"method": "ngram", "num_speculative_tokens": 8})
    elif proposer == "self:2":
        llm = LLM(loaded=zoo.load(model), speculative_config={"method": "draft_model", "model": "self:2"})
    out = llm.generate(prompt, greedy(30, stop=["never appears \u2603", stop]))[0].outputs[0]
    assert out.token_ids == ids[:end]  # token_ids end with the token that completed the stop string
    assert out.text == text and stop not in out.text
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


class EmptyProposer(Proposer):
    Options = SimpleNamespace

    def __init__(self, every: int = 0, script: Sequence[int] = ()):
        super().__init__(SimpleNamespace(num_speculative_tokens=4), target=None)
        self.every, self.script, self.step = every, list(script), 0

    def propose(self, tokens, max_tokens):
        self.step += 1
        if self.every and self.step % self.every == 0:
            return Draft(tokens=self.script[len(tokens) : len(tokens) + min(4, max_tokens)])
        return Draft(tokens=[])


def test_empty_drafts_are_plain_steps(zoo):
    llm = LLM(loaded=zoo.load("llama"))
    llm.proposer = EmptyProposer()
    out = llm.generate(PROMPTS[0], greedy())[0]
    assert out.outputs[0].token_ids == plain_ids(zoo, "llama", PROMPTS[0])
    s = out.spec_decoding_stats
    assert (s.num_drafts, s.num_draft_tokens, s.num_steps, s.mean_acceptance_length) == (0, 0, MAX_TOKENS - 1, 1.0)


def test_some_empty_drafts(zoo):
    llm = LLM(loaded=zoo.load("llama"))
    ids = llm.get_tokenizer()(PROMPTS[0]).input_ids + plain_ids(zoo, "llama", PROMPTS[0])
    llm.proposer = EmptyProposer(every=3, script=ids)
    out = llm.generate(PROMPTS[0], greedy())[0]
    assert out.outputs[0].token_ids == plain_ids(zoo, "llama", PROMPTS[0])
    s = out.spec_decoding_stats
    assert 0 < s.num_drafts < s.num_steps
    assert s.num_accepted_tokens == s.num_draft_tokens  # scripted drafts are the target's own choices
    check_stats(s)


def test_ngram_without_matches_drafts_nothing(zoo):
    config = {"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 5}
    out = run(zoo, "llama", config, "abcdefghij", greedy(5))
    assert out.spec_decoding_stats.num_draft_tokens == 0
    assert out.outputs[0].token_ids == plain_ids(zoo, "llama", "abcdefghij", 5)


# --- configuration errors through LLM ----------------------------------------------------------------------


def test_draft_model_with_another_vocabulary_is_rejected(zoo):
    target, draft = zoo.path("llama"), zoo.path("other_vocab")
    with pytest.raises(ValueError, match="vocabulary") as info:
        LLM(loaded=zoo.load("llama"), speculative_config={"method": "draft_model", "model": draft})
    assert target in str(info.value) and draft in str(info.value)
    assert "has 259 tokens" in str(info.value) and "draft has 260 tokens" in str(info.value)


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"method": "ngram", "num_speculative_tokens": 3, "lookahead": 2},
            "unknown key 'lookahead'.*valid keys: method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max",
        ),
        ({"method": "ngram", "num_speculative_tokens": "3"}, "num_speculative_tokens must be int"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be in 1..63"),
        ({"method": "eagle7"}, "unknown speculative method 'eagle7'; available: "),
        ({"method": "draft_model", "model": "self:9"}, "1..4"),
        ({"method": "draft_model", "model": "self:x"}, "self:N"),
        ({"method": "draft_model"}, "needs 'model'"),
    ],
)
def test_bad_speculative_configs_fail_at_construction(zoo, config, message):
    with pytest.raises(ValueError, match=message):
        LLM(loaded=zoo.load("llama"), speculative_config=config)


def test_prompt_longer_than_max_model_len_is_an_error(zoo):
    llm = LLM(loaded=zoo.load("llama"), max_model_len=20)
    with pytest.raises(ValueError, match="max_model_len 20"):
        llm.generate("x" * 10, greedy(11))
    assert len(llm.generate("x" * 10, greedy(9))[0].outputs[0].token_ids) == 9  # 1 BOS + 10 bytes + 9 = 20


# --- sampling ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        None,
        {"method": "ngram", "num_speculative_tokens": 3},
        {"method": "draft_model", "model": "self:2", "num_speculative_tokens": 3},
    ],
)
def test_seeded_sampling_is_reproducible(zoo, config):
    llm = LLM(loaded=zoo.load("llama"), speculative_config=config)

    def sample(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=20, seed=seed, ignore_eos=True)
        return llm.generate(PROMPTS[0], params)[0].outputs[0].token_ids

    assert sample(1) == sample(1)
    assert len({tuple(sample(seed)) for seed in range(2, 7)}) > 1


def test_sampled_self_draft_of_all_layers_is_always_accepted(zoo):
    """Draft q and target p are the same distribution only if both are warped identically (temperature,
    top-k, top-p); then u * q < p holds for every draft token."""
    config = {"method": "draft_model", "model": "self:4", "num_speculative_tokens": 4}
    llm = LLM(loaded=zoo.load("llama"), speculative_config=config)
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=30, seed=0, ignore_eos=True)
    for prompt in PROMPTS:
        llm.generate(prompt, params)
    assert llm.stats.acceptance_rate == 1.0


NUM_SAMPLES = 2500
SAMPLING_CASES = {"t1": dict(temperature=1.0), "warped": dict(temperature=0.8, top_k=8, top_p=0.9)}


@pytest.fixture(scope="module")
def small_prompt(zoo):
    """Holds every id of the 12-token vocabulary, so n-gram lookup always finds the last token and drafts."""
    prompt = [1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9, 0]
    assert sorted(set(prompt)) == list(range(zoo.load("small_vocab").vocab_size))
    return prompt


@pytest.fixture(scope="module")
def exact_first_tokens(zoo, small_prompt):
    """Exact target distributions of the small-vocabulary model after small_prompt, per sampling case:
    (P(x1, x2) as [V, V], P(x3) as [V])."""
    loaded = zoo.load("small_vocab")
    vocab = loaded.vocab_size
    runtime = loaded.new_runtime()

    def probs(context, case):
        runtime.reset(128)
        logits = runtime.forward(context, logit_rows="last").logits
        warp = SAMPLING_CASES[case]
        return sampling_probs(logits, warp["temperature"], warp.get("top_k", 0), warp.get("top_p", 1.0))[0].double()

    out = {}
    for case in SAMPLING_CASES:
        p1 = probs(small_prompt, case)
        joint12 = torch.stack([p1[a] * probs(small_prompt + [a], case) for a in range(vocab)])
        p3 = torch.zeros(vocab, dtype=torch.float64)
        for a in range(vocab):
            for b in range(vocab):
                if joint12[a, b] > 0:
                    p3 += joint12[a, b] * probs(small_prompt + [a, b], case)
        out[case] = (joint12.numpy(), p3.numpy())
    return out


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
@pytest.mark.parametrize(
    "method",
    ["plain", "draft_model", "ngram", "self:1"],
)
def test_sampling_distribution_matches_the_target(zoo, small_prompt, exact_first_tokens, case, method):
    """The first three generated tokens, sampled through the real engine, follow the target's exact
    distribution: the joint of the first two and the marginal of the third."""
    configs = {
        "plain": None,
        "draft_model": {"method": "draft_model", "model": zoo.path("small_vocab_draft"), "num_speculative_tokens": 3},
        "ngram": {"method": "ngram", "num_speculative_tokens": 3},
        "self:1": {"method": "draft_model", "model": "self:1", "num_speculative_tokens": 2},
    }
    llm = LLM(loaded=zoo.load("small_vocab"), speculative_config=configs[method])
    vocab = llm.model.vocab_size
    samples = sample_token_ids(llm, small_prompt, NUM_SAMPLES, 3, **SAMPLING_CASES[case])
    assert samples.shape == (NUM_SAMPLES, 3)
    joint12, p3 = exact_first_tokens[case]
    pairs = np.bincount(samples[:, 0] * vocab + samples[:, 1], minlength=vocab * vocab)
    assert chi_square_pvalue(pairs, joint12) > 1e-4
    assert chi_square_pvalue(np.bincount(samples[:, 0], minlength=vocab), joint12.sum(1)) > 1e-4
    assert chi_square_pvalue(np.bincount(samples[:, 2], minlength=vocab), p3) > 1e-4
    if method != "plain":  # both the accept and the reject paths ran
        assert llm.stats.num_accepted_tokens >= 100, llm.stats.num_accepted_tokens
        assert llm.stats.acceptance_rate < 0.95, llm.stats.acceptance_rate
