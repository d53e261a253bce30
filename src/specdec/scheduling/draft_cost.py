"""The drafter's cost in a step: a fixed part for calling it at all, a part per level (the draft's depth: a
network drafter makes one call per level for all of its sequences) and a part per drafted token.

A per-token average alone prices badly across batch sizes: at one sequence drafting 8 tokens, EAGLE-3's 8
calls of about 1 ms each read as 1 ms per token, and when 32 sequences then joined, 4 tokens each were priced
at 128 ms (they cost about 25): the policy drafted nothing for 54 steps. Estimated by least squares over
recent steps that drafted, weighted by recency (each new step multiplies the older weights by DECAY), with
no negative part. What the steps cannot tell apart (one sequence: as many tokens as levels) goes to the
levels first, then to the fixed part: an estimate too low gets measured and corrected by the drafts it lets
through, one too high would stop drafting, and so its own correction.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

DECAY = 0.95  # per drafting step: about the last 20 steps count
# Ridge weights (relative to each feature's weighted mean square) that settle the split the data leaves open
RIDGE = (1e-4, 1e-6, 1e-3)  # fixed, per level, per token

FEATURES = 3  # 1, levels, tokens


@dataclass
class DraftCost:
    fixed_ms: float = 0.0  # per step in which anything is drafted
    per_level_ms: float = 0.0  # per level of the deepest draft in the step
    per_token_ms: float = 0.0
    # recency-weighted sums of x_i * x_j and x_i * y over the features x = (1, levels, tokens), y the step's ms
    _xx: list[list[float]] = field(default_factory=lambda: [[0.0] * FEATURES for _ in range(FEATURES)])
    _xy: list[float] = field(default_factory=lambda: [0.0] * FEATURES)

    def observe(self, ms: float, tokens: int, levels: int | None = None) -> None:
        """One step's drafting time over all its sequences, the tokens they drafted (> 0) and the depth of the
        deepest draft (None: as many as tokens, one sequence's chain)."""
        if tokens <= 0:
            return
        x = (1.0, float(tokens if levels is None else max(1, min(levels, tokens))), float(tokens))
        for i in range(FEATURES):
            self._xy[i] = DECAY * self._xy[i] + x[i] * ms
            for j in range(FEATURES):
                self._xx[i][j] = DECAY * self._xx[i][j] + x[i] * x[j]
        self._fit()

    def _fit(self) -> None:
        """Non-negative least squares over the three parts: the best fit among the subsets of parts left free
        whose solution has no negative part (seven small solves)."""
        best: tuple[float, list[float]] | None = None
        for k in range(FEATURES, 0, -1):
            for free in itertools.combinations(range(FEATURES), k):
                coef = self._solve(free)
                if coef is None or any(c < 0 for c in coef):
                    continue
                loss = self._loss(coef)
                if best is None or loss < best[0] - 1e-12 * abs(best[0]):
                    best = (loss, coef)
        coef = best[1] if best is not None else [0.0] * FEATURES
        self.fixed_ms, self.per_level_ms, self.per_token_ms = coef

    def _solve(self, free: tuple[int, ...]) -> list[float] | None:
        n = len(free)
        a = [[self._xx[i][j] + (RIDGE[i] * self._xx[i][i] if i == j else 0.0) for j in free] for i in free]
        b = [self._xy[i] for i in free]
        # Gaussian elimination with partial pivoting (at most 3 x 3)
        for c in range(n):
            p = max(range(c, n), key=lambda r: abs(a[r][c]))
            if abs(a[p][c]) < 1e-12:
                return None
            a[c], a[p], b[c], b[p] = a[p], a[c], b[p], b[c]
            for r in range(c + 1, n):
                f = a[r][c] / a[c][c]
                for cc in range(c, n):
                    a[r][cc] -= f * a[c][cc]
                b[r] -= f * b[c]
        sol = [0.0] * n
        for r in range(n - 1, -1, -1):
            sol[r] = (b[r] - sum(a[r][cc] * sol[cc] for cc in range(r + 1, n))) / a[r][r]
        coef = [0.0] * FEATURES
        for i, v in zip(free, sol):
            coef[i] = v
        return coef

    def _loss(self, coef: list[float]) -> float:
        """The weighted squared error up to the constant sum of w * y^2, plus the ridge terms."""
        quad = sum(coef[i] * coef[j] * self._xx[i][j] for i in range(FEATURES) for j in range(FEATURES))
        ridge = sum(RIDGE[i] * self._xx[i][i] * coef[i] ** 2 for i in range(FEATURES))
        return quad - 2 * sum(c * y for c, y in zip(coef, self._xy)) + ridge

    def ms(self, tokens: float, levels: float | None = None) -> float:
        """The predicted cost of drafting `tokens` tokens whose deepest draft has `levels` levels (None: a
        single chain, as many as tokens)."""
        if tokens <= 0:
            return 0.0
        depth = tokens if levels is None else levels
        return self.fixed_ms + self.per_level_ms * depth + self.per_token_ms * tokens
