"""The target's forward cost against the rows it runs: what a draft row costs at a given batch size.

Measured once at start-up on the actual model and machine (a few dozen forwards): `single[n]` is one
sequence forwarding n rows, and `per_sequence` the extra cost of each further sequence in the same forward
(its attention and bookkeeping), so a batch of B sequences with n rows in all costs about
single(n) + (B - 1) * per_sequence.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdec.models.runtime import ForwardCall, ModelRuntime, forward_batch

ROW_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class CostCurve:
    rows: list[int]  # ascending
    ms: list[float]  # one sequence forwarding rows[i] rows
    per_sequence_ms: float = 0.0

    def single(self, n: int) -> float:
        """ms for one sequence forwarding n rows: piecewise linear, extrapolated past the last point."""
        r, m = self.rows, self.ms
        if n <= r[0]:
            return m[0]
        i = min(bisect_left(r, n), len(r) - 1)
        lo, hi = i - 1, i
        slope = (m[hi] - m[lo]) / (r[hi] - r[lo])
        return m[lo] + slope * (n - r[lo])

    def batch(self, sequences: int, rows: int) -> float:
        return self.single(rows) + max(sequences - 1, 0) * self.per_sequence_ms

    def to_dict(self) -> dict[str, object]:
        return {"rows": self.rows, "ms": [round(x, 3) for x in self.ms],
                "per_sequence_ms": round(self.per_sequence_ms, 3)}


def measure_cost_curve(new_runtime: Callable[[], ModelRuntime], capacity: int = 512,
                       row_counts: Sequence[int] = ROW_COUNTS, repeats: int = 2,
                       context: int = 128, sequences: int = 8) -> CostCurve:
    """Times forwards of n rows after a `context`-token prefix in a `capacity`-slot cache (the best of
    `repeats`), then a batch of `sequences` one-row sequences for the per-sequence overhead."""
    counts = [n for n in row_counts if context + n <= capacity]
    runtimes = [new_runtime() for _ in range(sequences)]
    for rt in runtimes:
        rt.reset(capacity)
        rt.prefill([1 + (i % 100) for i in range(context)])

    def best(run: Callable[[], None]) -> float:
        times = []
        for _ in range(repeats + 1):  # the first run warms up
            t = time.perf_counter()
            run()
            times.append((time.perf_counter() - t) * 1000)
        return min(times[1:])

    def single(n: int) -> None:
        runtimes[0].forward([5] * n, logit_rows="all")
        runtimes[0].truncate(context)

    def batched() -> None:
        forward_batch(runtimes, [ForwardCall([5], logit_rows="all") for _ in runtimes])
        for rt in runtimes:
            rt.truncate(context)

    ms = [best(lambda n=n: single(n)) for n in counts]
    curve = CostCurve(list(counts), ms)
    extra = best(batched) - curve.single(sequences)
    curve.per_sequence_ms = max(extra / (sequences - 1), 0.0) if sequences > 1 else 0.0
    return curve
