"""hybrid: prompt lookup where the context repeats, a fallback drafter elsewhere; lossless either way."""

from __future__ import annotations

import numpy as np
import pytest
from specdec import LLM, SamplingParams

from eagle3_helpers import make_random_eagle3
from medusa_helpers import make_random_medusa
from mtp_helpers import make_random_mtp
from stat_helpers import chi_square_pvalue, sample_token_ids
from test_engine import NUM_SAMPLES, SAMPLING_CASES, exact_first_tokens, small_prompt  # noqa: F401 (fixtures)

# the second prompt repeats itself, so lookups find matches from the start
PROMPTS = ["The quick brown fox", "one two three four one two three four one two three"]


def _fallback(zoo, tmp_path, kind: str) -> tuple[object, dict]:
    if kind == "eagle3_chain":
        target = zoo.load("gemma3_text")
        return target, {"method": "eagle3", "model": make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200),
                        "num_speculative_tokens": 3, "confidence_threshold": 0.01}
    if kind == "eagle3_tree":
        target = zoo.load("llama")
        return target, {"method": "eagle3", "model": make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200),
                        "num_speculative_tokens": 3, "tree_top_k": 3, "tree_num_draft_tokens": 8}
    if kind == "mtp":
        target = zoo.load("gemma3_text")
        return target, {"method": "mtp", "model": make_random_mtp(target, tmp_path / "d", draft_vocab_size=200,
                                                                  num_modules=2), "num_speculative_tokens": 3}
    if kind == "medusa":
        target = zoo.load("llama")
        return target, {"method": "medusa", "model": make_random_medusa(target, tmp_path / "d", draft_vocab_size=200),
                        "tree_num_draft_tokens": 8}
    return zoo.load("llama"), {"method": "draft_model", "model": zoo.path("llama_draft"), "num_speculative_tokens": 3}


@pytest.mark.parametrize("kind", ["eagle3_chain", "eagle3_tree", "mtp", "medusa", "draft_model"])
def test_greedy_equals_plain_and_both_parts_draft(zoo, tmp_path, kind):
    target, fallback = _fallback(zoo, tmp_path, kind)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    plain = LLM(loaded=target)
    llm = LLM(loaded=target, speculative_config={"method": "hybrid", "fallback": fallback, "prompt_lookup_min": 2})
    for prompt in PROMPTS:
        assert llm.generate(prompt, params)[0].outputs[0].token_ids == plain.generate(prompt, params)[0].outputs[0].token_ids
    assert llm.proposer.drafted_by_lookup > 0 and llm.proposer.drafted_by_fallback > 0
    assert llm.stats.num_accepted_tokens > 0


def test_a_fallback_that_drafts_for_itself_is_always_accepted(zoo):
    """The target as its own fallback draft model: an off-by-one in the fallback's state after lookup
    steps would show as rejections."""
    target = zoo.load("llama")
    config = {"method": "hybrid", "prompt_lookup_min": 1, "prompt_lookup_max": 1,
              "fallback": {"method": "draft_model", "model": zoo.path("llama"), "num_speculative_tokens": 3}}
    llm = LLM(loaded=target, speculative_config=config)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    for prompt in PROMPTS:
        llm.generate(prompt, params)
    assert llm.proposer.drafted_by_lookup > 0 and llm.proposer.drafted_by_fallback > 0
    fallback_steps = llm.proposer.drafted_by_fallback
    assert llm.stats.num_accepted_tokens >= 3 * fallback_steps * 0.9  # the fallback's drafts all pass


@pytest.mark.parametrize(
    "config, match",
    [
        ({"method": "hybrid"}, "fallback must be"),
        ({"method": "hybrid", "fallback": {"method": "ngram"}}, "fallback must be"),
        ({"method": "hybrid", "fallback": {"method": "eagle3"}}, "needs 'model'"),
        ({"method": "hybrid", "fallback": {"method": "mtp", "bogus": 1}}, "unknown key 'bogus'"),
        ({"method": "hybrid", "fallback": {"method": "mtp"}, "prompt_lookup_min": 0}, "prompt_lookup_min"),
    ],
)
def test_bad_configs_are_clear_errors(zoo, config, match):
    with pytest.raises(ValueError, match=match):
        LLM(loaded=zoo.load("llama"), speculative_config=config)


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_sampling_distribution_matches_the_target(zoo, small_prompt, exact_first_tokens, case):  # noqa: F811
    config = {"method": "hybrid", "prompt_lookup_min": 1, "prompt_lookup_max": 1, "num_speculative_tokens": 2,
              "fallback": {"method": "draft_model", "model": zoo.path("small_vocab_draft"), "num_speculative_tokens": 2}}
    llm = LLM(loaded=zoo.load("small_vocab"), speculative_config=config)
    vocab = llm.model.vocab_size
    # the prompt holds every token once: the first lookup always hits, later ones sometimes miss
    samples = sample_token_ids(llm, small_prompt, NUM_SAMPLES, 3, **SAMPLING_CASES[case])
    joint12, p3 = exact_first_tokens[case]
    pairs = np.bincount(samples[:, 0] * vocab + samples[:, 1], minlength=vocab * vocab)
    assert chi_square_pvalue(pairs, joint12) > 1e-4
    assert chi_square_pvalue(np.bincount(samples[:, 2], minlength=vocab), p3) > 1e-4
    assert llm.stats.num_accepted_tokens >= 100 and llm.stats.acceptance_rate < 0.95


def test_bench_reports_which_part_drafted(zoo, tmp_path):
    from specdec.bench.runner import run_bench

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "one two three four one two three four one two", "category": "x"}\n'
                       '{"prompt": "The quick brown fox", "category": "x"}\n')
    config = {"method": "hybrid", "prompt_lookup_min": 1, "prompt_lookup_max": 1,
              "fallback": {"method": "draft_model", "model": zoo.path("llama_draft"), "num_speculative_tokens": 3}}
    report = run_bench(str(prompts), speculative_config=config, loaded=zoo.load("llama"), max_new_tokens=24,
                       warmup=1, progress=False)
    counts = report["proposer_counters"]
    assert counts["lookup_steps"] > 0 and counts["fallback_steps"] > 0
    # the warm-up (the first prompt once more) is not counted: at most one draft per generated token
    assert counts["lookup_steps"] + counts["fallback_steps"] <= 2 * 24
