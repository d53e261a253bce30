"""How many draft tokens each running sequence gets this step.

- FixedDraftLength: the method's num_speculative_tokens, always.
- DraftLengthByBatchSize: a length per range of running sequences (vLLM's per-batch-size setting).
- AutoDraftLength: per sequence and step, the lengths (zero included) that maximise the batch's expected
  tokens per second: (sum over s of 1 + E[accepted_s(k_s)]) / (T(B, sum of 1 + k_s) + D(sum of k_s)), with
  T the measured cost curve, D the drafter's measured cost (a fixed part per drafting step, a part per level
  of the deepest draft and a part per token, scheduling/draft_cost.py) and E[accepted_s(k)] = sum over i < k of r_s,i, where r_s,i is the fraction of
  the sequence's drafts reaching position i whose tokens 0..i were all accepted. A greedy marginal
  allocation: add one draft row at a time to the sequence whose next row is likeliest to be kept, and
  keep the prefix of that order with the best ratio.

  Rates only move where drafts are made, so two rules keep a few early rejections from switching drafting
  off for good: the batch-wide counts fade (half-life HALF_LIFE sequence-steps), so new sequences start
  from recent evidence; and a sequence given no draft for PROBE_AFTER steps gets one draft row where a row
  kept at FIRST_GUESS would pay for its target rows and its drafting, priced at the last measured drafting
  cost halved every DRAFT_COST_HALF_LIFE steps without a draft (so that a cost measured under a burst of
  load is measured again). Only probes see that faded cost: when it priced every draft, a drafter that did
  not pay (DFlash here: 16 ms a step for 0.35 tokens of a 36 ms step) looked cheap again after 32 plain
  steps and drafted at a loss for a few steps each time, a quarter of all steps. The drafting cost D is what a drafting
  step takes beyond the target forward the curve predicts (step_overhead), or the drafter's own time where
  that is more. T is the curve scaled by what recent steps without a draft took against it (target_scale):
  the curve is timed at one context length, and at 32 sequences of 200-350 tokens a plain step took 1.3x
  its prediction; unscaled, that gap counted as drafting cost in every drafting step.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec.engine.stats import SpecDecodingStats
from specdec.scheduling.cost_curve import CostCurve
from specdec.scheduling.draft_cost import DraftCost

PRIOR_WEIGHT = 4.0  # a new sequence's rates start from the batch's, worth this many drafts of its own
FIRST_GUESS = 0.6  # acceptance at position 0 before anything was measured
HALF_LIFE = 256  # sequence-steps over which the batch-wide counts halve
PROBE_AFTER = 32  # steps without a draft after which a sequence gets a probe row (where one can pay)
DRAFT_COST_HALF_LIFE = 32  # steps without a draft over which the drafting cost probes are priced at halves
SCALE_DECAY = 0.9  # per step without a draft: target_scale follows about the last 10 of them
SCALE_LIMITS = (0.5, 4.0)  # a step's wall time against the curve's prediction, outside which it is noise


class DraftLengthPolicy(ABC):
    @abstractmethod
    def choose(self, stats: Sequence[SpecDecodingStats], caps: Sequence[int], prefill_rows: int = 0,
               prefill_sequences: int = 0, early_exit: bool = False,
               weights: Sequence[float] | None = None) -> list[int]:
        """Draft lengths for the decoding sequences, given each one's statistics so far and its cap, in a step
        that also forwards `prefill_rows` prompt rows of `prefill_sequences` other sequences; `early_exit`:
        one greedy sequence alone, whose verification scores the head only for rows still alive; `weights`: what
        a token of each sequence is worth (None: all 1), see AutoDraftLength.choose."""

    def describe(self) -> dict[str, object]:
        return {"policy": type(self).__name__}


@dataclass
class FixedDraftLength(DraftLengthPolicy):
    length: int | None = None  # None: whatever the method drafts (its num_speculative_tokens, tree depth)

    def choose(self, stats: Sequence[SpecDecodingStats], caps: Sequence[int], prefill_rows: int = 0,
               prefill_sequences: int = 0, early_exit: bool = False,
               weights: Sequence[float] | None = None) -> list[int]:
        return list(caps) if self.length is None else [min(self.length, c) for c in caps]

    def describe(self) -> dict[str, object]:
        return {"policy": "fixed", "num_speculative_tokens": self.length}


@dataclass
class DraftLengthByBatchSize(DraftLengthPolicy):
    ranges: tuple[tuple[int, int, int], ...]
    default: int

    def length_for(self, batch_size: int) -> int:
        return next((k for first, last, k in self.ranges if first <= batch_size <= last), self.default)

    def choose(self, stats: Sequence[SpecDecodingStats], caps: Sequence[int], prefill_rows: int = 0,
               prefill_sequences: int = 0, early_exit: bool = False,
               weights: Sequence[float] | None = None) -> list[int]:
        k = self.length_for(len(caps))
        return [min(k, c) for c in caps]

    def describe(self) -> dict[str, object]:
        return {"policy": "by_batch_size", "ranges": [list(r) for r in self.ranges]}


@dataclass
class AutoDraftLength(DraftLengthPolicy):
    curve: CostCurve
    max_length: int
    draft: DraftCost = field(default_factory=DraftCost)  # the drafter's cost in a step, measured while drafting
    continuation_prior: float | None = None  # the method's (Proposer.continuation_prior), see batch_rates
    prior: list[float] = field(default_factory=list)  # the batch's rates so far, per position
    target_scale: float = 1.0  # recent steps without a draft: wall time / the curve's prediction
    _scale_seen: bool = False
    _accepted: list[float] = field(default_factory=list)
    _drafted: list[float] = field(default_factory=list)
    _allowed: list[float] = field(default_factory=list)  # [i]: sequence-steps whose policy allowed position i
    _granted: float = 0.0  # draft tokens allowed, and drafted, over the batch's sequence-steps
    _filled: float = 0.0
    _steps_without_draft: int = 0  # steps since the drafting cost was last measured

    def observe(self, num_accepted_per_position: Sequence[int], drafted_per_position: Sequence[int],
                allowed: int | None = None, drafted_tokens: int | None = None) -> None:
        """Adds one sequence-step's counts to the batch-wide rates (the prior of sequences with little
        history), after fading the older counts: what was accepted and drafted per position, how many
        positions the policy allowed (None: as many as drafted) and how many tokens were drafted (None: the
        positions drafted; a tree's nodes otherwise)."""
        fade = 0.5 ** (1 / HALF_LIFE)
        self._drafted = [x * fade for x in self._drafted]
        self._accepted = [x * fade for x in self._accepted]
        self._allowed = [x * fade for x in self._allowed]
        self._granted, self._filled = self._granted * fade, self._filled * fade
        positions = len(drafted_per_position) if allowed is None else allowed
        for i in range(max(positions, len(drafted_per_position))):
            while len(self._drafted) <= i:
                self._drafted.append(0.0)
                self._accepted.append(0.0)
                self._allowed.append(0.0)
            self._drafted[i] += drafted_per_position[i] if i < len(drafted_per_position) else 0
            self._accepted[i] += num_accepted_per_position[i] if i < len(num_accepted_per_position) else 0
            self._allowed[i] += 1 if i < positions else 0
        self._granted += positions
        self._filled += sum(drafted_per_position) if drafted_tokens is None else drafted_tokens

    def observe_drafting(self, draft_seconds: float, draft_tokens: int, levels: int | None = None) -> None:
        """One step's drafting time, drafted tokens over all of its sequences and deepest draft (levels); a
        step that drafted nothing makes probes cheaper (probe_draft_ms), so a cost that stopped drafting is
        measured again before long."""
        if draft_tokens > 0:
            self.draft.observe(draft_seconds * 1000, draft_tokens, levels)
            self._steps_without_draft = 0
        else:
            self._steps_without_draft += 1

    def probe_draft_ms(self, tokens: float, levels: float | None = None) -> float:
        """The drafting cost a probe is priced at: the measured one, halved every DRAFT_COST_HALF_LIFE steps
        since it was last measured."""
        return self.draft.ms(tokens, levels) * 0.5 ** (self._steps_without_draft / DRAFT_COST_HALF_LIFE)

    def target_ms(self, sequences: int, rows: int, kept: float, lone: bool) -> float:
        """The target forward's cost in ms: the curve, scaled by target_scale."""
        ms = self.curve.early_exit(rows, kept + 1) if lone else self.curve.batch(sequences, rows)
        return ms * self.target_scale

    def observe_plain_step(self, wall_seconds: float, sequences: int, lone: bool) -> None:
        """A decode step that drafted nothing (and read no prompt): its wall time against the curve's."""
        predicted = self.curve.early_exit(sequences, 1) if lone else self.curve.batch(sequences, sequences)
        if predicted <= 0:
            return
        ratio = min(max(wall_seconds * 1000 / predicted, SCALE_LIMITS[0]), SCALE_LIMITS[1])
        self.target_scale = ratio if not self._scale_seen else SCALE_DECAY * self.target_scale + (1 - SCALE_DECAY) * ratio
        self._scale_seen = True

    def step_overhead(self, wall_seconds: float, sequences: int, drafted: int, kept: int, lone: bool) -> float:
        """What a decode step that drafted took beyond the target forward predicted for it (the scaled curve),
        in seconds: the drafter, and everything else a drafted sequence costs (its verification and commit,
        the drafter's catching up on the accepted tokens). The scheduler takes it as the drafter's cost
        when it exceeds the drafter's own timing: timing the drafter alone left the rest out, and at 32
        sequences EAGLE-3 `"auto"` then drafted at a loss (0.88x plain)."""
        return max(wall_seconds - self.target_ms(sequences, sequences + drafted, kept, lone) / 1000, 0.0)

    def batch_rates(self, n: int) -> list[float]:
        """The batch's r_i for i < n. A position's prior continues the positions before it at their last
        measured continuation rate (r_i-1 / r_i-2), so positions never drafted yet are neither written off
        nor assumed: a policy that only ever drafted 2 tokens still sees what a third would likely bring,
        tries it when that pays, and then measures it. Position 1 has no measured continuation before it:
        the method's continuation_prior where it has one, else r_0 itself (geometric). Lookup needs the
        prior: on a target whose rows cost more (gguf: 16 rows twice one), r_1 = r_0^2 made a second row
        look unprofitable, so deeper positions were rarely drafted or measured, and "auto" kept its drafts short
        (k=1 in 67 of 69 steps of a RAG prompt; docs/benchmarks.md)."""
        out: list[float] = []
        for i in range(n):
            if i == 0:
                guess = FIRST_GUESS
            elif i == 1 and self.continuation_prior is not None:
                guess = out[0] * self.continuation_prior
            else:
                before = out[i - 2] if i >= 2 else 1.0
                guess = out[i - 1] * min(out[i - 1] / before, 1.0) if before > 0 else 0.0
            drafted = self._drafted[i] if i < len(self._drafted) else 0.0
            accepted = self._accepted[i] if i < len(self._accepted) else 0.0
            out.append((accepted + PRIOR_WEIGHT * guess) / (drafted + PRIOR_WEIGHT))
        return out

    def rates(self, s: SpecDecodingStats, cap: int, batch: Sequence[float] | None = None) -> list[float]:
        """r_i for i < cap: the sequence's own acceptance at position i, shrunk towards the batch's."""
        batch = self.batch_rates(cap) if batch is None else batch
        out, prev = [], 1.0
        for i in range(cap):
            drafted = s.drafted_per_position[i] if i < len(s.drafted_per_position) else 0
            accepted = s.accepted_per_position[i] if i < len(s.accepted_per_position) else 0
            r = (accepted + PRIOR_WEIGHT * batch[i]) / (drafted + PRIOR_WEIGHT)
            prev = min(prev, r)  # reaching position i needs every earlier one: rates never rise
            out.append(prev)
        return out

    def batch_reach(self, n: int) -> list[float]:
        """The batch's share of allowed positions i < n that were drafted: a drafter with a confidence rule
        stops before its allowance (EAGLE-3 at threshold 0.45 drafted 55 of 102 tokens allowed at 32
        MT-Bench sequences), and its acceptance at deep positions, measured only where it got there, would
        otherwise count for every allowed position. 1 until measured; never rises with i."""
        out, prev = [], 1.0
        for i in range(n):
            drafted = self._drafted[i] if i < len(self._drafted) else 0.0
            allowed = self._allowed[i] if i < len(self._allowed) else 0.0
            prev = min(prev, (min(drafted, allowed) + PRIOR_WEIGHT) / (allowed + PRIOR_WEIGHT))
            out.append(prev)
        return out

    def batch_fill(self) -> float:
        """Draft tokens made per token allowed, over the batch (1 until measured)."""
        return (min(self._filled, self._granted) + PRIOR_WEIGHT) / (self._granted + PRIOR_WEIGHT)

    def reach(self, s: SpecDecodingStats, cap: int, batch: Sequence[float]) -> list[float]:
        """The sequence's share of allowed positions i < cap that it drafted, shrunk towards the batch's."""
        allowed, out, prev = 0, [], 1.0
        lengths = s.chosen_draft_lengths
        for i in range(cap):
            allowed = sum(lengths[i + 1 :])  # steps whose policy allowed more than i tokens
            drafted = s.drafted_per_position[i] if i < len(s.drafted_per_position) else 0
            prev = min(prev, (min(drafted, allowed) + PRIOR_WEIGHT * batch[i]) / (allowed + PRIOR_WEIGHT))
            out.append(prev)
        return out

    def fill(self, s: SpecDecodingStats, batch: float) -> float:
        """The sequence's draft tokens per token allowed (a tree fills its allowance with nodes even where
        it is shallow), shrunk towards the batch's."""
        granted = sum(k * n for k, n in enumerate(s.chosen_draft_lengths))
        return (min(s.num_draft_tokens, granted) + PRIOR_WEIGHT * batch) / (granted + PRIOR_WEIGHT)

    def choose(self, stats: Sequence[SpecDecodingStats], caps: Sequence[int], prefill_rows: int = 0,
               prefill_sequences: int = 0, early_exit: bool = False,
               weights: Sequence[float] | None = None) -> list[int]:
        """Each allowed position i of a sequence is worth reach_i * r_i tokens (the chance that it is drafted
        at all, times that it is kept) and costs `fill` rows and draft tokens: what the sequence's allowed
        tokens made of drafts so far. `weights` scale each sequence's tokens in the objective. The scheduler passes them while a closed
        batch drains (nothing waits and nothing more will come): then the run ends when its longest sequence
        does, and a token of a sequence near its end shortens it less than one of a sequence far from it."""
        b = len(stats)
        w = [1.0] * b if weights is None else list(weights)
        caps = [min(c, self.max_length) for c in caps]
        batch = self.batch_rates(max(caps, default=0))
        batch_reach, batch_fill = self.batch_reach(max(caps, default=0)), self.batch_fill()
        rates, reaches = [], []
        for s, c in zip(stats, caps):
            reach = self.reach(s, c, batch_reach)
            reaches.append(reach)
            rates.append([r * q for r, q in zip(self.rates(s, c, batch), reach)])
        fills = [self.fill(s, batch_fill) for s in stats]
        lengths = [0] * b
        # The step's prompt rows are paid for anyway: next to a prefill chunk, draft rows add little to its
        # cost and multiply what the decoding sequences get out of it.
        seqs = b + prefill_sequences
        tokens, rows = float(sum(w)), b + prefill_rows

        def cost() -> float:  # with early exit, the head is scored for about the tokens kept
            return self.target_ms(seqs, rows, tokens - 1, early_exit)

        best_ratio, best_rows, best_tokens = tokens / cost(), 0, tokens
        made = 0.0  # draft tokens expected (the allowed rows times each sequence's fill)
        # the sequence whose next row is likeliest kept (the first on ties), from a heap: a linear scan per
        # row cost milliseconds a step at 32 sequences of 8 rows, a few percent of the step
        heap = [(-w[i] * r[0], i) for i, r in enumerate(rates) if caps[i] > 0 and r[0] > 0 and w[i] > 0]
        heapq.heapify(heap)
        picks: list[int] = []
        # the deepest draft expected so far (a network drafter's calls): an allowed position is drafted only
        # as often as the drafter gets there (reach), and the drafter's per-level cost was measured on the
        # levels it drafted. Counting every allowed level kept a lone EAGLE-3 sequence at 4.7 tokens allowed
        # where 8 made 7% more tokens/s.
        depth = [0.0] * b
        levels, best_levels, best_made = 0.0, 0.0, 0.0
        while heap:
            gain, pick = heapq.heappop(heap)
            depth[pick] += reaches[pick][lengths[pick]]
            lengths[pick] += 1
            levels = max(levels, depth[pick])
            picks.append(pick)
            tokens -= gain
            rows += fills[pick]
            made += fills[pick]
            ratio = tokens / (cost() + self.draft.ms(made, levels))
            if ratio > best_ratio:
                best_ratio, best_rows, best_tokens, best_levels, best_made = ratio, len(picks), tokens, levels, made
            if lengths[pick] < caps[pick] and rates[pick][lengths[pick]] > 0:
                heapq.heappush(heap, (-w[pick] * rates[pick][lengths[pick]], pick))
        best = [0] * b
        for pick in picks[:best_rows]:
            best[pick] += 1
        # Probes: one row for a sequence left without a draft for PROBE_AFTER steps, where a row kept at
        # FIRST_GUESS would pay for the target's cost of it and the drafter's (a first drafted row in the
        # step pays the drafter's fixed cost too: at 32 sequences an EAGLE-3 call costs about a quarter of a
        # plain step, and probes priced without it cost more than drafting ever gained there).
        tokens, drafted = best_tokens, best_made
        rows = b + prefill_rows + best_made
        levels = max(best_levels, 1.0)
        for i, s in enumerate(stats):
            if best[i] == 0 and caps[i] > 0 and s.steps_since_allowed >= PROBE_AFTER:
                before = tokens / (cost() + self.probe_draft_ms(drafted, best_levels if drafted else 0))
                tokens, rows, drafted = tokens + w[i] * FIRST_GUESS, rows + 1, drafted + 1
                if tokens / (cost() + self.probe_draft_ms(drafted, levels)) > before:
                    best_levels = levels
                    best[i] = 1
                else:
                    tokens, rows, drafted = tokens - w[i] * FIRST_GUESS, rows - 1, drafted - 1
        return best

    def describe(self) -> dict[str, object]:
        return {"policy": "auto", "max_num_speculative_tokens": self.max_length, "cost_curve": self.curve.to_dict(),
                "target_scale": round(self.target_scale, 3),
                "draft_fixed_ms": round(self.draft.fixed_ms, 3), "draft_ms_per_level": round(self.draft.per_level_ms, 3),
                "draft_ms_per_token": round(self.draft.per_token_ms, 3)}
