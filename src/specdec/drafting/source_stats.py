"""The hybrid's adaptive choice: per request, which part drafts the next step, prompt lookup or the fallback.

Running estimates (exponential moving averages) of the tokens a step gains (accepted + 1), for lookup by
the length n of the matched n-gram and for the fallback, and of the seconds a step of each source takes
(draft + target verify + commit). The source with the higher expected tokens per second, gain / seconds,
drafts. An estimate moves only when its source is measured, so a source declined `explore_every` steps in
a row drafts the next step anyway, and again while such steps beat the incumbent's rate: a stale estimate
recovers in a few steps once the text changes.
"""

from __future__ import annotations

LOOKUP, FALLBACK = "lookup", "fallback"


class SourceStats:
    weight = 0.15  # of a new measurement in an average: about the last 1 / weight steps count
    explore_every = 16  # a source declined this many steps in a row drafts the next one
    prior_gain = 2.0  # tokens per step of either source before any measurement (ties go to lookup: it drafts for free)
    max_cost_ratio = 4.0  # a step slower than 4x the estimate (a GC pause, a batch-mate's prefill) counts as 4x

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lookup_gain: dict[int, float] = {}  # match length n -> tokens per lookup step
        self.fallback_gain = self.prior_gain
        self.cost: dict[str, float | None] = {LOOKUP: None, FALLBACK: None}  # seconds per step; None: unmeasured
        self.declined = {LOOKUP: 0, FALLBACK: 0}  # steps in a row the source could have drafted and did not
        self.exploring: str | None = None  # the source forced on the step in flight

    def gain(self, source: str, match: int) -> float:
        return self.lookup_gain.get(match, self.prior_gain) if source == LOOKUP else self.fallback_gain

    def rate(self, source: str, match: int, gain: float | None = None) -> float:
        """Expected tokens per second (per step until both sources' step times are measured: one alone
        would compare seconds with nothing)."""
        tokens = self.gain(source, match) if gain is None else gain
        if self.cost[LOOKUP] is None or self.cost[FALLBACK] is None:
            return tokens
        return tokens / max(self.cost[source] or 0.0, 1e-9)

    def choose(self, match: int) -> str:
        """The source of the next step, where lookup matched an n-gram of length `match` (0: no match)."""
        self.exploring = None
        if not match:
            self.declined[FALLBACK] = 0
            return FALLBACK
        best = LOOKUP if self.rate(LOOKUP, match) >= self.rate(FALLBACK, match) else FALLBACK
        other = FALLBACK if best == LOOKUP else LOOKUP
        chosen = best
        if self.declined[other] >= self.explore_every:
            chosen = self.exploring = other
        self.declined[chosen] = 0
        self.declined[FALLBACK if chosen == LOOKUP else LOOKUP] += 1
        return chosen

    def record_gain(self, source: str, match: int, tokens: float) -> None:
        if source == self.exploring:
            # an exploration that beat the incumbent's rate is repeated next step (the average needs several)
            incumbent = FALLBACK if source == LOOKUP else LOOKUP
            if self.rate(source, match, tokens) > self.rate(incumbent, match):
                self.declined[source] = self.explore_every
            self.exploring = None
        new = self._average(self.gain(source, match), tokens)
        if source == LOOKUP:
            self.lookup_gain[match] = new
        else:
            self.fallback_gain = new

    def record_cost(self, source: str, seconds: float) -> None:
        old = self.cost[source]
        self.cost[source] = seconds if old is None else self._average(old, min(seconds, self.max_cost_ratio * old))

    def _average(self, old: float, new: float) -> float:
        return old + self.weight * (new - old)
