"""Draft-length policies: fixed, per batch size, and the automatic one from a cost curve."""

from __future__ import annotations

import pytest

from specdec.engine.stats import SpecDecodingStats
from specdec.scheduling.cost_curve import CostCurve
from specdec.scheduling.draft_length import (
    DRAFT_COST_HALF_LIFE,
    HALF_LIFE,
    PROBE_AFTER,
    AutoDraftLength,
    DraftLengthByBatchSize,
    FixedDraftLength,
)
from specdec.speculative_config import SpeculativeConfig


def history(rates: list[float], steps: int = 100) -> SpecDecodingStats:
    s = SpecDecodingStats()
    s.drafted_per_position = [steps] * len(rates)
    s.accepted_per_position = [int(r * steps) for r in rates]
    return s


EXPENSIVE = CostCurve([1, 64], [10.0, 640.0])  # every row costs a full step: speculation cannot pay
CHEAP = CostCurve([1, 64], [10.0, 10.5])  # rows are nearly free: draft as much as allowed


def test_auto_drafts_nothing_when_rows_cost_a_full_step():
    policy = AutoDraftLength(EXPENSIVE, max_length=5)
    assert policy.choose([history([0.9, 0.8, 0.7, 0.6, 0.5])] * 4, [5] * 4) == [0, 0, 0, 0]


def test_auto_drafts_beside_a_prefill_chunk_that_pays_for_the_step():
    """Rows that cost a full step each do not pay alone, but next to a 2000-row prompt chunk the step's cost
    hardly moves while each accepted draft token is one more token out of it."""
    policy = AutoDraftLength(EXPENSIVE, max_length=5)
    alone = policy.choose([history([0.9, 0.8, 0.7, 0.6, 0.5])] * 4, [5] * 4)
    beside = policy.choose([history([0.9, 0.8, 0.7, 0.6, 0.5])] * 4, [5] * 4, prefill_rows=2000, prefill_sequences=1)
    assert alone == [0, 0, 0, 0] and beside == [5, 5, 5, 5]


def test_auto_drafts_the_most_when_rows_are_nearly_free():
    policy = AutoDraftLength(CHEAP, max_length=5)
    assert policy.choose([history([0.9, 0.8, 0.7, 0.6, 0.5])] * 4, [5] * 4) == [5, 5, 5, 5]


def test_auto_gives_rows_to_the_sequences_that_keep_them():
    curve = CostCurve([1, 8, 64], [10.0, 12.0, 80.0])
    policy = AutoDraftLength(curve, max_length=5)
    good, bad = history([0.95, 0.9, 0.85, 0.8, 0.75]), history([0.02, 0.0, 0.0, 0.0, 0.0])
    lengths = policy.choose([good, bad, good], [5, 5, 5])
    assert lengths[1] == 0 and lengths[0] > 0 and lengths[2] > 0


def test_auto_respects_each_sequences_cap_and_the_draft_cost():
    policy = AutoDraftLength(CHEAP, max_length=4)
    assert policy.choose([history([0.9] * 5)] * 2, [2, 7]) == [2, 4]
    policy.draft.per_token_ms = 100.0  # a drafter far slower than the target: not worth it
    assert policy.choose([history([0.9] * 5)] * 2, [2, 7]) == [0, 0]


def test_auto_starts_a_new_sequence_from_the_batch_rates():
    policy = AutoDraftLength(CostCurve([1, 64], [10.0, 73.0]), max_length=5)  # a row: 10% of a step
    for _ in range(50):
        policy.observe([0, 0], [1, 1])  # the batch's drafts never get kept
    assert policy.choose([SpecDecodingStats()], [5]) == [0]


def test_auto_batch_rates_fade_so_new_sequences_try_again():
    """Early rejections lock new sequences out only for a while: the batch-wide counts fade, so after a
    stretch without drafts a new sequence is priced near FIRST_GUESS again and drafts where that pays."""
    policy = AutoDraftLength(CostCurve([1, 64], [10.0, 73.0]), max_length=5)  # a row: 10% of a step
    for _ in range(30):
        policy.observe([0], [1])
    assert policy.choose([SpecDecodingStats()], [5]) == [0]
    for _ in range(4 * HALF_LIFE):
        policy.observe([], [])  # steps without a draft
    assert policy.choose([SpecDecodingStats()], [5])[0] >= 1


def test_auto_probes_a_sequence_left_without_drafts_where_a_row_would_pay():
    policy = AutoDraftLength(CostCurve([1, 64], [10.0, 73.0]), max_length=5)
    poor = history([0.0, 0.0], steps=40)
    for _ in range(PROBE_AFTER):
        assert policy.choose([poor], [5]) == [0]
        poor.record_choice(0)
    assert poor.steps_since_allowed == PROBE_AFTER
    assert policy.choose([poor], [5]) == [1]  # one row, priced at FIRST_GUESS for its first position
    poor.record_choice(1)
    assert poor.steps_since_allowed == 0 and policy.choose([poor], [5]) == [0]
    assert AutoDraftLength(EXPENSIVE, max_length=5).choose([poor] * 2, [5] * 2) == [0, 0]
    poor.steps_since_allowed = PROBE_AFTER
    assert AutoDraftLength(EXPENSIVE, max_length=5).choose([poor] * 2, [5] * 2) == [0, 0]  # never pays: no probe


def test_auto_probes_past_a_stale_drafting_cost():
    """A drafting cost measured under a burst of load stops every draft, probes included (they pay the
    drafter too), and is measured again only by drafting: steps without a draft fade it until a probe pays."""
    policy = AutoDraftLength(CHEAP, max_length=5)
    policy.draft.per_token_ms = 1000.0
    fresh, idle = history([0.9] * 5), history([0.9] * 5)
    idle.steps_since_allowed = PROBE_AFTER
    assert policy.choose([fresh, idle], [5, 5]) == [0, 0]
    for _ in range(20 * DRAFT_COST_HALF_LIFE):
        policy.observe_drafting(0.0, 0)
    assert policy.probe_draft_ms(1) < 1.0
    assert policy.choose([fresh, idle], [5, 5]) == [0, 1]  # the idle one probes; the estimate itself stands
    assert policy.draft.per_token_ms == 1000.0


def test_auto_drafting_that_does_not_pay_stays_off_between_probes():
    """A drafter measured to cost more than its kept tokens save is not tried again by every sequence as the
    steps without a draft go by: only a probe per PROBE_AFTER steps measures it again."""
    policy = AutoDraftLength(CostCurve([1, 64], [36.0, 400.0]), max_length=2)
    policy.draft.fixed_ms = 16.0
    s = history([0.35, 0.1])
    for step in range(1, 4 * PROBE_AFTER):
        s.steps_since_allowed = step % PROBE_AFTER or PROBE_AFTER
        k = policy.choose([s], [2])
        assert k == ([1] if step % PROBE_AFTER == 0 else [0])
        policy.observe_drafting(0.016 if k[0] else 0.0, k[0])


def test_auto_stops_drafting_where_the_steps_cost_more_than_the_curve_and_the_drafter_say():
    """The scheduler prices a drafting step's unexplained time (its wall time beyond the target forward the
    cost curve predicts) as drafting cost: a drafter that looked free stops being used once steps show it."""
    policy = AutoDraftLength(CHEAP, max_length=5)
    seqs = [history([0.6] * 5) for _ in range(4)]
    assert sum(policy.choose(seqs, [5] * 4)) > 0  # looks free: drafts
    target_ms = CHEAP.batch(4, 4 + 20)
    overhead = policy.step_overhead((target_ms + 500.0) / 1000, 4, 20, 8, lone=False)
    assert overhead == pytest.approx(0.5)
    for _ in range(5):
        policy.observe_drafting(overhead, 20)
    assert policy.choose(seqs, [5] * 4) == [0] * 4


def test_auto_scales_the_curve_by_what_steps_without_a_draft_took():
    """The curve is timed at one context length: where plain steps take 3x its prediction, every target row
    costs 3x too, the same drafter is then worth its rows, and a drafting step that took 3x the curve's
    forward left nothing unexplained to charge the drafter with."""
    curve = CostCurve([1, 64], [10.0, 42.0])
    policy = AutoDraftLength(curve, max_length=1)
    policy.draft.per_token_ms = 2.0
    seqs = [history([0.6]) for _ in range(4)]
    assert policy.choose(seqs, [1] * 4) == [0] * 4  # at the curve's own prices a draft row does not pay
    for _ in range(30):
        policy.observe_plain_step(3 * curve.batch(4, 4) / 1000, 4, lone=False)
    assert policy.target_scale == pytest.approx(3.0)
    assert policy.choose(seqs, [1] * 4) == [1] * 4
    assert policy.step_overhead(3 * curve.batch(4, 8) / 1000, 4, 4, 2, lone=False) == pytest.approx(0.0)
    policy.observe_plain_step(100.0, 4, lone=False)  # a stall: counted at most SCALE_LIMITS[1]
    assert policy.target_scale <= 0.9 * 3.0 + 0.1 * 4.0 + 1e-9


def test_drafting_cost_splits_into_fixed_per_level_and_per_token_parts():
    from specdec.scheduling.draft_cost import DraftCost

    cost = DraftCost()
    for levels, tokens in ((1, 1), (8, 8), (2, 16), (4, 32), (3, 96), (8, 64), (1, 32), (5, 5)):
        cost.observe(2.0 + 1.0 * levels + 0.2 * tokens, tokens, levels)  # a step, each call, each token
    assert cost.fixed_ms == pytest.approx(2.0, abs=0.05)
    assert cost.per_level_ms == pytest.approx(1.0, abs=0.02) and cost.per_token_ms == pytest.approx(0.2, abs=0.01)
    assert cost.ms(0) == 0.0 and cost.ms(40, 4) == pytest.approx(2.0 + 4.0 + 8.0, rel=0.02)
    one_level = DraftCost()
    for tokens in (1, 8, 2, 16, 4, 32):
        one_level.observe(6.0 + 0.25 * tokens, tokens, 1)  # one call whatever the tokens (n-gram, Medusa)
    assert one_level.ms(4, 1) == pytest.approx(7.0, rel=0.01) and one_level.ms(64, 1) == pytest.approx(22.0, rel=0.01)


def test_drafting_cost_measured_on_one_sequence_does_not_price_a_batch_per_token():
    """One sequence drafting 8-token chains (8 calls of 1 ms): the cost is taken as per level, so 32 sequences
    drafting 4 tokens each are priced at about 4 calls, not at 128 tokens of 1 ms (which kept EAGLE-3 from
    drafting at 32 sequences for 54 steps)."""
    from specdec.scheduling.draft_cost import DraftCost

    cost = DraftCost()
    for _ in range(20):
        cost.observe(8.0, 8)  # levels None: one sequence's chain
    assert cost.ms(8) == pytest.approx(8.0, rel=0.01)
    assert cost.ms(128, 4) < 8.0


def test_auto_drafts_for_a_batch_after_pricing_the_drafter_on_one_sequence():
    curve = CostCurve([1, 32, 64, 160], [25.0, 30.0, 40.0, 75.0])
    policy = AutoDraftLength(curve, max_length=4)
    for _ in range(20):
        policy.observe_drafting(0.008, 8)  # 8 ms for one sequence's 8 tokens
    seqs = [history([0.8] * 4) for _ in range(32)]
    assert sum(policy.choose(seqs, [4] * 32)) >= 64


def test_auto_prices_the_drafters_fixed_cost_once_per_step():
    """A drafter call that costs 40% of a target step is not worth one sequence's 0.3 of a token, but is
    worth many sequences' drafts together, where its cost is shared."""
    curve = CostCurve([1, 64], [10.0, 10.5])  # target rows nearly free
    policy = AutoDraftLength(curve, max_length=1)
    policy.draft.fixed_ms = 4.0
    one = policy.choose([history([0.3])], [1])
    many = policy.choose([history([0.6])] * 16, [1] * 16)
    assert one == [0] and many == [1] * 16


def test_fixed_and_per_batch_size():
    assert FixedDraftLength(3).choose([SpecDecodingStats()] * 2, [5, 1]) == [3, 1]
    assert FixedDraftLength(None).choose([SpecDecodingStats()] * 2, [5, 1]) == [5, 1]
    policy = DraftLengthByBatchSize(((1, 4, 5), (5, 16, 2)), default=0)
    assert policy.choose([SpecDecodingStats()] * 3, [9] * 3) == [5] * 3
    assert policy.choose([SpecDecodingStats()] * 8, [9] * 8) == [2] * 8
    assert policy.choose([SpecDecodingStats()] * 20, [9] * 20) == [0] * 20


def test_cost_curve_interpolates_and_extrapolates():
    curve = CostCurve([1, 2, 4], [10.0, 11.0, 15.0], per_sequence_ms=0.5)
    assert curve.single(3) == pytest.approx(13.0)
    assert curve.single(6) == pytest.approx(19.0)
    assert curve.batch(3, 4) == pytest.approx(16.0)


@pytest.mark.parametrize("bad, message", [
    ({"num_speculative_tokens": "auto", "max_num_speculative_tokens": 0}, "max_num_speculative_tokens"),
    ({"max_num_speculative_tokens": 3}, "goes with"),
    ({"num_speculative_tokens_by_batch_size": [[4, 1, 2]]}, "first_batch_size"),
    ({"num_speculative_tokens_by_batch_size": [[1, 4, 2], [3, 8, 1]]}, "overlap"),
    ({"num_speculative_tokens": "auto", "num_speculative_tokens_by_batch_size": [[1, 4, 2]]}, "exclude"),
])
def test_bad_schedules_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict({"method": "ngram", **bad})


def test_auto_config_round_trips():
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": "auto", "max_num_speculative_tokens": 7})
    assert c.auto and c.num_speculative_tokens == 7
    assert SpeculativeConfig.from_dict(c.to_dict()) == c


def test_auto_cap_defaults_to_the_methods_own():
    from specdec.drafting.ngram import NgramOptions

    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": "auto"})
    assert c.num_speculative_tokens == NgramOptions.auto_max_speculative_tokens == 15
    assert SpeculativeConfig.from_dict({"method": "ngram"}).num_speculative_tokens == 5  # fixed: unchanged
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": "auto", "max_num_speculative_tokens": 3})
    assert c.num_speculative_tokens == 3


def test_auto_drafts_longer_for_a_lone_greedy_sequence_that_verifies_with_early_exit():
    """Alone and greedy, verification scores the LM head only for the rows still alive (about the accepted
    tokens + 1), so a rejected draft row costs only its share of the body: worth drafting further."""
    curve = CostCurve([1, 8], [10.0, 40.0], head_ms=[6.0, 30.0])  # the head is most of each row's cost
    assert curve.early_exit(6, 3.0) == pytest.approx(curve.single(6) - curve.head(6) + curve.head(3))
    policy = AutoDraftLength(curve, max_length=5)
    h = history([0.9, 0.8, 0.7, 0.6, 0.5])
    [without] = policy.choose([h], [5])
    [with_early_exit] = policy.choose([h], [5], early_exit=True)
    assert 1 <= without < with_early_exit == 5
    assert AutoDraftLength(CostCurve([1, 8], [10.0, 40.0]), max_length=5).choose([h], [5], early_exit=True) == [
        without]  # no head share measured: costed as before


def test_measured_cost_curve_splits_off_the_head(zoo):
    from specdec.scheduling.cost_curve import measure_cost_curve

    curve = measure_cost_curve(zoo.load("llama").new_runtime, capacity=64, row_counts=(1, 2, 4), min_passes=1,
                               max_passes=2, context=8, sequences=2)
    assert curve.head_ms is not None and len(curve.head_ms) == 3
    assert min(curve.head_ms) >= 0.0 and curve.head_ms == sorted(curve.head_ms)  # timings: no bound on values


def test_auto_tries_positions_it_never_drafted_when_the_earlier_ones_are_kept():
    """A policy that only ever drafted 2 tokens has no counts for a third: its prior continues the measured
    positions (here about 0.8), not a fixed decay that would keep it at 2 for good."""
    curve = CostCurve([1, 8], [10.0, 17.0])  # a row: 10% of a step
    policy = AutoDraftLength(curve, max_length=5)
    policy.observe([90, 85], [100, 100])
    assert policy.batch_rates(3)[2] > 0.75
    assert policy.choose([history([0.9, 0.85])], [5]) == [5]
    poor = AutoDraftLength(curve, max_length=5)  # mostly rejected: the continuation is poor too
    poor.observe([20, 2], [100, 100])
    assert poor.choose([history([0.2, 0.02])], [5])[0] <= 1  # one row (10% of a step) for 0.2 of a token


def test_auto_gives_a_tree_only_the_rows_it_priced(zoo, tmp_path, monkeypatch):
    """The policy prices a draft by the rows it adds, so a tree drafted under "auto" brings at most the chosen
    number of nodes (its first ones, shallowest first), however many the method's tree options allow; the
    output is still plain decoding's."""
    from eagle3_helpers import make_random_eagle3
    from specdec import LLM, SamplingParams
    from specdec.engine import step as step_module

    target = zoo.load("gemma3_text")
    monkeypatch.setattr(target, "cost_curve", CHEAP, raising=False)  # rows nearly free: drafts the most allowed
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    llm = LLM(loaded=target, speculative_config={"method": "eagle3", "model": path, "num_speculative_tokens": "auto",
                                                  "max_num_speculative_tokens": 3, "tree_top_k": 3,
                                                  "tree_num_draft_tokens": 12})
    rows: list[int] = []
    real = step_module.forward_batch
    monkeypatch.setattr(step_module, "forward_batch", lambda rts, calls: rows.extend(
        len(c.tokens) for c in calls if c.parents is not None) or real(rts, calls))
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in ([1, 2, 3, 4], [9, 8, 7])]
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert out == [o.outputs[0].token_ids for o in LLM(loaded=target).generate(prompts, params)]
    assert rows and max(rows) == 4  # the root and 3 nodes, not the 12 a depth-3 tree of top-3 children has


def test_auto_counts_the_positions_a_drafter_with_a_confidence_rule_does_not_reach():
    """A drafter that was allowed 8 tokens in each of 40 steps but stopped after 2 in most of them: its
    acceptance at deep positions (measured only where it got there) is worth that position's reach, and
    the policy allows it little more than it drafts."""
    curve = CostCurve([1, 64], [10.0, 136.0])  # a row costs a fifth of a step
    policy = AutoDraftLength(curve, max_length=8)
    stops = SpecDecodingStats()
    stops.chosen_draft_lengths = [0] * 8 + [40]
    stops.drafted_per_position = [40, 40] + [3] * 6
    stops.accepted_per_position = [36, 32] + [3] * 6
    stops.num_draft_tokens = sum(stops.drafted_per_position)
    reaches = SpecDecodingStats()  # the same acceptance where it drafted, and it drafted what it was allowed
    reaches.chosen_draft_lengths = [0] * 8 + [40]
    reaches.drafted_per_position = [40] * 8
    reaches.accepted_per_position = [36, 32, 30, 28, 26, 24, 22, 20]
    reaches.num_draft_tokens = 320
    assert policy.reach(stops, 8, [1.0] * 8)[2] < 0.2 and policy.reach(reaches, 8, [1.0] * 8)[7] == 1.0
    assert policy.choose([stops], [8]) == [2]
    assert policy.choose([reaches], [8])[0] >= 6


def test_auto_weights_favour_the_sequence_furthest_from_its_end():
    """While a closed batch drains, a token of the sequence with the most left to generate is worth more: with
    room for one draft row, it goes to that sequence, whichever the scheduler lists first."""
    curve = CostCurve([1, 2, 3, 64], [10.0, 10.0, 10.1, 100.0])  # the third row costs little, more cost a lot
    policy = AutoDraftLength(curve, max_length=1)
    seqs = [history([0.8]), history([0.8])]
    assert policy.choose(seqs, [1, 1]) == [1, 1]
    assert policy.choose(seqs, [1, 1], weights=[0.05, 1.0]) == [0, 1]
    assert policy.choose(seqs, [1, 1], weights=[1.0, 0.05]) == [1, 0]


def test_drain_weights_follow_the_tokens_left():
    from types import SimpleNamespace

    from specdec.scheduling.scheduler import drain_weights

    seqs = [SimpleNamespace(room=99), SimpleNamespace(room=49), SimpleNamespace(room=0)]
    assert drain_weights(seqs) == [1.0, 0.5, 0.01]  # type: ignore[arg-type]


STEEP = CostCurve([1, 2, 4, 8, 16], [13.0, 14.2, 15.5, 18.5, 24.5])  # the gguf target's: 16 rows cost 1.9x one


def test_a_continuation_prior_lets_lookup_draft_past_its_measured_first_position():
    """Only position 0 measured (30% kept), on a curve where rows cost: the geometric guess (0.6, 0.36,
    0.22, ...) stops the draft at 4 rows; n-gram lookup's prior (a copy stays right 85% of the time once it
    was right) makes a longer draft pay, and then measured rates take over."""
    first_only = history([0.3])
    assert AutoDraftLength(STEEP, max_length=15).choose([first_only], [15]) == [4]
    with_prior = AutoDraftLength(STEEP, max_length=15, continuation_prior=0.85)
    assert with_prior.choose([first_only], [15])[0] >= 9
    measured = history([0.3, 0.03, 0.003])  # deeper positions measured as nearly never kept: drafts shrink
    assert with_prior.choose([measured], [15])[0] <= 2


def test_the_llm_gives_auto_its_methods_continuation_prior(zoo, monkeypatch):
    from specdec import LLM

    target = zoo.load("gemma3_text")
    monkeypatch.setattr(target, "cost_curve", CHEAP, raising=False)  # no timing here; the zoo's model is shared
    assert LLM(loaded=target, speculative_config={"method": "ngram", "num_speculative_tokens": "auto"}
               ).draft_length_policy.continuation_prior == 0.85
    assert LLM(loaded=target, speculative_config={"method": "draft_model", "model": "self:1",
                                                  "num_speculative_tokens": "auto"}
               ).draft_length_policy.continuation_prior is None


class _Clock:
    """A fake perf_counter that forwards advance: what a burst of load does to them is then exact."""

    def __init__(self, burst: tuple[float, float], slowdown: float) -> None:
        self.now, self.burst, self.slowdown, self.forwards = 0.0, burst, slowdown, 0

    def __call__(self) -> float:
        return self.now

    def forward(self, runtimes, calls) -> None:
        self.forwards += 1
        rows = sum(len(c.tokens) for c in calls)
        ms = 20.0 + 0.5 * rows + (5.0 if calls[0].logit_rows is not None else 0.0) + 0.3 * (len(calls) - 1)
        loaded = self.burst[0] <= self.now < self.burst[1]
        self.now += ms / 1000 * (self.slowdown if loaded else 1.0)


class _StubRuntime:
    def reset(self, capacity: int) -> None: ...
    def prefill(self, tokens) -> None: ...
    def truncate(self, length: int) -> None: ...


@pytest.mark.parametrize("burst", [(0.2, 0.9), (0.5, 1.4), (0.0, 1.2)])
def test_cost_curve_measurement_sees_through_a_burst_of_load(monkeypatch, burst):
    """A burst of load (here forwards 3x slower for 0.7-1.2 s) during the start-up measurement left the curve
    at 3x for good, timed back to back; interleaved passes that run on until one improves nothing recover
    the unloaded costs exactly."""
    from specdec.scheduling import cost_curve

    clock = _Clock(burst, 3.0)
    monkeypatch.setattr(cost_curve.time, "perf_counter", clock)
    monkeypatch.setattr(cost_curve, "forward_batch", clock.forward)
    curve = cost_curve.measure_cost_curve(_StubRuntime, row_counts=(1, 2, 4, 8, 16), context=8, sequences=4)
    assert curve.ms == pytest.approx([25.5, 26.0, 27.0, 29.0, 33.0])
    assert curve.head_ms == pytest.approx([5.0] * 5)
    assert curve.per_sequence_ms == pytest.approx(0.3)  # 4 one-row sequences: 0.3 ms each beyond 4 rows


def test_cost_curve_measurement_stops_on_a_machine_loaded_throughout(monkeypatch):
    from specdec.scheduling import cost_curve

    clock = _Clock((0.0, 1e9), 3.0)
    monkeypatch.setattr(cost_curve.time, "perf_counter", clock)
    monkeypatch.setattr(cost_curve, "forward_batch", clock.forward)
    curve = cost_curve.measure_cost_curve(_StubRuntime, row_counts=(1, 2), context=8, sequences=2)
    assert curve.ms == pytest.approx([3 * 25.5, 3 * 26.0])
    assert clock.forwards == 5 * (1 + cost_curve.MIN_PASSES)  # steady times: the fewest passes
