"""hybrid: prompt lookup where the context repeats, a fallback drafter elsewhere, chosen per step ("adaptive",
from measured gain and step time) or whenever lookup matches ("fixed"); lossless either way."""

from __future__ import annotations

import numpy as np
import pytest
from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.drafting.base import Draft, Proposer
from specdec.drafting.hybrid import HybridOptions, HybridProposer
from specdec.drafting.ngram import find_continuation
from specdec.drafting.source_stats import FALLBACK, LOOKUP, SourceStats

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


@pytest.mark.parametrize("selection", ["adaptive", "fixed"])
@pytest.mark.parametrize("kind", ["eagle3_chain", "eagle3_tree", "mtp", "medusa", "draft_model"])
def test_greedy_equals_plain_and_both_parts_draft(zoo, tmp_path, kind, selection):
    target, fallback = _fallback(zoo, tmp_path, kind)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    plain = LLM(loaded=target)
    llm = LLM(loaded=target, speculative_config={"method": "hybrid", "fallback": fallback, "prompt_lookup_min": 2,
                                                 "selection": selection})
    for prompt in PROMPTS:
        assert llm.generate(prompt, params)[0].outputs[0].token_ids == plain.generate(prompt, params)[0].outputs[0].token_ids
    assert llm.proposer.drafted_by_lookup > 0 and llm.proposer.drafted_by_fallback > 0
    assert llm.stats.num_draft_tokens > 0 and llm.stats.num_accepted_tokens > 0


@pytest.mark.parametrize("selection", ["adaptive", "fixed"])
def test_a_fallback_that_drafts_for_itself_is_always_accepted(zoo, selection):
    """The target as its own fallback draft model: an off-by-one in the fallback's state after lookup
    steps would show as rejections."""
    target = zoo.load("llama")
    config = {"method": "hybrid", "prompt_lookup_min": 1, "prompt_lookup_max": 1, "selection": selection,
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
        ({"method": "hybrid", "fallback": {"method": "mtp"}, "selection": "best"}, "selection must be one of"),
    ],
)
def test_bad_configs_are_clear_errors(zoo, config, match):
    with pytest.raises(ValueError, match=match):
        LLM(loaded=zoo.load("llama"), speculative_config=config)


@pytest.mark.parametrize("selection", ["adaptive", "fixed"])
@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_sampling_distribution_matches_the_target(zoo, small_prompt, exact_first_tokens, case, selection):  # noqa: F811
    config = {"method": "hybrid", "prompt_lookup_min": 1, "prompt_lookup_max": 1, "num_speculative_tokens": 2,
              "selection": selection,
              "fallback": {"method": "draft_model", "model": zoo.path("small_vocab_draft"), "num_speculative_tokens": 2}}
    llm = LLM(loaded=zoo.load("small_vocab"), speculative_config=config)
    vocab = llm.model.vocab_size
    # The prompt holds every token once, so lookup (n = 1) always matches: "fixed" drafts by lookup only.
    # "adaptive" drafts the first step by lookup (its prior), and where that step's draft is rejected (its
    # estimate falls below the fallback's prior) the fallback drafts the second, which makes the third token.
    samples = sample_token_ids(llm, small_prompt, NUM_SAMPLES, 4, **SAMPLING_CASES[case])
    joint12, p3 = exact_first_tokens[case]
    pairs = np.bincount(samples[:, 0] * vocab + samples[:, 1], minlength=vocab * vocab)
    assert chi_square_pvalue(pairs, joint12) > 1e-4
    assert chi_square_pvalue(np.bincount(samples[:, 2], minlength=vocab), p3) > 1e-4
    assert llm.stats.num_accepted_tokens >= 100 and llm.stats.acceptance_rate < 0.95
    assert llm.proposer.drafted_by_lookup > 0
    assert (llm.proposer.drafted_by_fallback > 0) == (selection == "adaptive")


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


# The adaptive rule, driven by hand: a fake clock, a fake fallback, and a known greedy continuation `truth`.

WRONG = 999  # a token `truth` never holds


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Oracle(Proposer):
    """A fallback whose draft holds the next `right` tokens of the truth, then wrong ones."""

    def __init__(self, truth: list[int], right: int, k: int = 3) -> None:
        super().__init__(None, None)  # type: ignore[arg-type]
        self.truth, self.right, self.k, self.feedbacks = truth, right, k, 0

    @property
    def num_speculative_tokens(self) -> int:
        return self.k

    def propose(self, tokens, max_tokens):
        n = min(self.k, max_tokens)
        return Draft(tokens=[*self.truth[len(tokens):len(tokens) + min(self.right, n)], *[WRONG] * (n - self.right)])

    def feedback(self, num_accepted, verified=None, path=None):
        self.feedbacks += 1


def _hybrid(truth, right=3, selection="adaptive", lookup=(1, 1)):
    options = HybridOptions(num_speculative_tokens=5, prompt_lookup_min=lookup[0], prompt_lookup_max=lookup[1],
                            selection=selection)
    hybrid = HybridProposer(options, None, fallback=_Oracle(truth, right))  # type: ignore[arg-type]
    hybrid.clock = _Clock()
    hybrid.begin([], SamplingParams(), None, 0)
    return hybrid


def _drive(hybrid, truth, steps, seconds, tokens=None):
    """Runs greedy steps against `truth`, a step of each part taking `seconds[part]` on the fake clock;
    returns the tokens and, per step, (context, draft, part that drafted)."""
    tokens = list(truth[:8]) if tokens is None else tokens
    log = []
    for _ in range(steps):
        lookup_steps = hybrid.drafted_by_lookup
        draft = hybrid.propose(tokens, 8).tokens
        source = LOOKUP if hybrid.drafted_by_lookup > lookup_steps else FALLBACK
        hybrid.clock.now += seconds[source]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == truth[len(tokens) + accepted]:
            accepted += 1
        hybrid.feedback(accepted)
        log.append((list(tokens), draft, source))
        tokens = truth[:len(tokens) + accepted + 1]
    return tokens, log


PERIODIC = list(range(10, 17)) * 200  # lookup's drafts are all accepted
RANDOM = np.random.default_rng(0).integers(0, 3, 3000).tolist()  # lookup (n = 1) is right one time in three


def test_the_rule_compares_tokens_per_second():
    stats = SourceStats()
    assert stats.choose(2) == LOOKUP  # priors tie, and lookup drafts for free
    for _ in range(60):
        stats.record_gain(LOOKUP, 2, 2.0)
        stats.record_gain(FALLBACK, 0, 3.0)
        stats.record_cost(LOOKUP, 1.0)
        stats.record_cost(FALLBACK, 2.0)
    assert stats.choose(2) == LOOKUP  # 2 tokens a second beat 1.5
    assert stats.choose(0) == FALLBACK  # no match: nothing to compare
    for _ in range(60):
        stats.record_cost(FALLBACK, 1.0)
    assert stats.choose(2) == FALLBACK  # 3 beat 2
    assert stats.lookup_gain == {2: pytest.approx(2.0, abs=0.01)}


@pytest.mark.parametrize("truth, lookup_seconds, winner", [
    (PERIODIC, 1.0, LOOKUP),  # gains more per step, at less cost
    (RANDOM, 0.2, LOOKUP),  # gains less per step (~1.5 tokens against 4), but its steps cost a fifth
    (RANDOM, 1.0, FALLBACK),  # low acceptance, and the step costs about the same
])
def test_the_part_with_more_tokens_per_second_drafts(truth, lookup_seconds, winner):
    hybrid = _hybrid(truth)
    _, log = _drive(hybrid, truth, 200, {LOOKUP: lookup_seconds, FALLBACK: 1.2})
    sources = [source for _, _, source in log]
    assert sources[100:].count(winner) >= 85  # the other part drafts only to explore
    counts = hybrid.counters()
    assert counts["lookup_steps"] + counts["fallback_steps"] == 200 == hybrid.fallback.feedbacks
    assert counts["explored_steps"] > 0
    if truth is PERIODIC:
        assert counts["fallback_steps"] == counts["explored_steps"]  # every fallback step explored
        assert counts["fallback_tokens"] == 4 * counts["fallback_steps"]


def test_fallback_steps_keep_lookups_estimate_current():
    """Where the fallback drafts beside a lookup draft, what lookup would have had accepted (its common prefix
    with the committed tokens) updates lookup's estimate without a lookup step."""
    hybrid = _hybrid(RANDOM)
    hybrid.stats.explore_every = 10**9
    seconds = {LOOKUP: 1.0, FALLBACK: 1.2}
    tokens, _ = _drive(hybrid, RANDOM, 10, seconds)  # lookup drafts on the prior, then no more
    estimates = [hybrid.stats.lookup_gain[1]]
    for _ in range(9):
        tokens, log = _drive(hybrid, RANDOM, 10, seconds, tokens)
        assert LOOKUP not in [source for _, _, source in log]
        estimates.append(hybrid.stats.lookup_gain[1])
    assert len(set(estimates)) == 10  # it moved every ten steps
    assert 1.2 < estimates[-1] < 1.8  # a draft token is right one time in three: ~1.5 tokens a step


@pytest.mark.parametrize("explore", [True, False])
def test_a_stale_estimate_recovers_by_exploration(explore):
    """Lookup is bad, then the text turns periodic. Fallback steps tell nothing new about lookup there (its
    draft matches all the committed tokens: censored), so only exploration brings lookup back."""
    truth = RANDOM[:400] + PERIODIC
    hybrid = _hybrid(truth)
    if not explore:
        hybrid.stats.explore_every = 10**9
    seconds = {LOOKUP: 1.0, FALLBACK: 1.2}
    tokens, log = _drive(hybrid, truth, 80, seconds)
    assert [s for _, _, s in log[40:]].count(FALLBACK) >= 36 and len(tokens) < 400  # still in the random part
    tokens, log = _drive(hybrid, truth, 150, seconds, tokens)
    late = [s for _, _, s in log[-40:]]
    assert late.count(LOOKUP) >= 36 if explore else late.count(FALLBACK) == 40


def test_fixed_is_the_old_rule():
    """Lookup whenever the last n >= prompt_lookup_min tokens occurred before, whatever was measured."""
    hybrid = _hybrid(RANDOM, right=0, selection="fixed", lookup=(3, 4))
    _, log = _drive(hybrid, RANDOM, 300, {LOOKUP: 5.0, FALLBACK: 1.0})
    for tokens, draft, source in log:
        old = find_continuation(np.asarray(tokens, dtype=np.int64), 3, 4, 5)
        assert (source, draft) == ((LOOKUP, old) if old else (FALLBACK, [WRONG] * 3))
    assert 0 < hybrid.drafted_by_lookup < 300 and hybrid.counters()["explored_steps"] == 0


@pytest.mark.parametrize("isa, tokens", [("amx", 15), ("avx512_bf16", 7), ("avx2", 7), (None, 7)])
def test_the_lookup_length_defaults_to_what_verification_rows_cost(monkeypatch, isa, tokens):
    """15 where the bf16 kernels are the AMX build (16 verification rows cost about one), else 7; a length
    the user gives wins."""
    from specdec.models import fast_linear

    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: isa)
    config = SpeculativeConfig.from_dict({"method": "hybrid", "fallback": {"method": "mtp"}})
    assert config.options.num_speculative_tokens == tokens
    config = SpeculativeConfig.from_dict({"method": "hybrid", "num_speculative_tokens": 4,
                                          "fallback": {"method": "mtp"}})
    assert config.options.num_speculative_tokens == 4
