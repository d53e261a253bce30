"""The drafter's cost in a step: a fixed part for calling it at all, plus a part per drafted token.

A network drafter pays per call (Python, a drafter forward per level, its LM head) about as much for one
sequence's token as for many; a per-token average alone then prices a step where one sequence drafts one
token at a fraction of what it costs. Estimated by least squares over recent steps that drafted, (tokens,
ms) pairs weighted by recency (each new step multiplies the older weights by DECAY).
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.95  # per drafting step: about the last 20 steps count


@dataclass
class DraftCost:
    fixed_ms: float = 0.0  # per step in which anything is drafted
    per_token_ms: float = 0.0
    _w: float = 0.0  # recency-weighted sums of 1, x, y, x^2, xy (x tokens, y ms)
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0

    def observe(self, ms: float, tokens: int) -> None:
        """One step's drafting time over all its sequences and the tokens they drafted (tokens > 0)."""
        if tokens <= 0:
            return
        self._w, self._x, self._y = DECAY * self._w + 1, DECAY * self._x + tokens, DECAY * self._y + ms
        self._xx, self._xy = DECAY * self._xx + tokens * tokens, DECAY * self._xy + tokens * ms
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mean_x * mean_x
        slope = (self._xy / self._w - mean_x * mean_y) / var if var > 1e-9 * max(mean_x * mean_x, 1.0) else None
        if slope is None:  # every step drafted as many tokens: no way to split, all of it per token
            self.fixed_ms, self.per_token_ms = 0.0, mean_y / mean_x
        elif slope < 0:  # more tokens never cost less: noise; all of it fixed
            self.fixed_ms, self.per_token_ms = mean_y, 0.0
        elif mean_y - slope * mean_x < 0:  # a negative fixed part is noise too: the line through 0
            self.fixed_ms, self.per_token_ms = 0.0, self._xy / self._xx
        else:
            self.fixed_ms, self.per_token_ms = mean_y - slope * mean_x, slope

    def fade(self, factor: float) -> None:
        """Scales the estimate by `factor` (< 1): a cost measured only while drafting would otherwise stay as
        it was for as long as it keeps drafting off (after a burst of load, say), and the policy would never
        measure it again."""
        self._y, self._xy = self._y * factor, self._xy * factor
        self.fixed_ms, self.per_token_ms = self.fixed_ms * factor, self.per_token_ms * factor

    def ms(self, tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * tokens if tokens > 0 else 0.0
