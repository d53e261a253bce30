"""The target's forward cost against the rows it runs: what a draft row costs at a given batch size.

Measured once at start-up on the actual model and machine (a few dozen forwards): `single[n]` is one
sequence forwarding n rows with logits for every row, `head[n]` the part of it spent in the LM head (a large
share on a CPU: Gemma's head is 262k x 640), and `per_sequence` the extra cost of each further sequence in
the same forward (its attention and bookkeeping), so a batch of B sequences with n rows in all costs about
single(n) + (B - 1) * per_sequence. A lone greedy sequence verifies with early exit
(verification/greedy_early_exit.py), which scores the head only for the rows still alive: about its
accepted tokens + 1, whatever it drafted.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec.engine.sequence import MAX_TOKENS_PER_FORWARD
from specdec.models.greedy_argmax import greedy_argmax
from specdec.models.runtime import ForwardCall, ModelRuntime, forward_batch

ROW_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
VERIFY_ROWS = 16  # rows whose argmax is timed, one call each as verification makes them


@dataclass
class CostCurve:
    rows: list[int]  # ascending
    ms: list[float]  # one sequence forwarding rows[i] rows, logits for every row
    per_sequence_ms: float = 0.0
    head_ms: list[float] | None = None  # the LM head's share of ms[i]; None: unknown (no early-exit saving)
    verify_ms_per_row: float = 0.0  # greedy verification's argmax over the vocabulary, per row with logits

    def single(self, n: int) -> float:
        """ms for one sequence forwarding n rows: piecewise linear, extrapolated past the last point."""
        return _interpolate(self.rows, self.ms, n)

    def head(self, n: float) -> float:
        return _interpolate(self.rows, self.head_ms, n) if self.head_ms is not None else 0.0

    def batch(self, sequences: int, rows: int) -> float:
        return self.single(rows) + max(sequences - 1, 0) * self.per_sequence_ms + rows * self.verify_ms_per_row

    def early_exit(self, rows: int, scored_rows: float) -> float:
        """ms for a lone sequence forwarding `rows` rows whose head is scored for about `scored_rows` only."""
        scored = min(scored_rows, rows)
        return self.single(rows) - self.head(rows) + self.head(scored) + scored * self.verify_ms_per_row

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"rows": self.rows, "ms": [round(x, 3) for x in self.ms],
                                  "per_sequence_ms": round(self.per_sequence_ms, 3),
                                  "verify_ms_per_row": round(self.verify_ms_per_row, 4)}
        if self.head_ms is not None:
            out["head_ms"] = [round(x, 3) for x in self.head_ms]
        return out


def _interpolate(rows: Sequence[int], ms: Sequence[float], n: float) -> float:
    """Piecewise linear in n, extrapolated past the last point."""
    if n <= rows[0] or len(rows) == 1:
        return ms[0]
    i = min(bisect_left(rows, n), len(rows) - 1)
    lo, hi = i - 1, i
    return ms[lo] + (ms[hi] - ms[lo]) / (rows[hi] - rows[lo]) * (n - rows[lo])


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

    def single(n: int, logit_rows: str | None = "all") -> None:
        runtimes[0].forward([5] * n, logit_rows=logit_rows)
        runtimes[0].truncate(context)

    def batched() -> None:
        forward_batch(runtimes, [ForwardCall([5], logit_rows="all") for _ in runtimes])
        for rt in runtimes:
            rt.truncate(context)

    ms = [best(lambda n=n: single(n)) for n in counts]
    # without logits: what early exit saves; only a lone sequence (at most one forward's rows) uses it
    body = [best(lambda n=n: single(n, None)) for n in counts if n <= MAX_TOKENS_PER_FORWARD]
    head = [max(m - b, 0.0) for m, b in zip(ms, body)]
    head = [max(head[: i + 1]) for i in range(len(head))]  # never falls with more rows (timing noise)
    head += [ms[i] * head[-1] / ms[len(head) - 1] for i in range(len(head), len(ms))]  # the same share
    curve = CostCurve(list(counts), ms, head_ms=head)
    extra = best(batched) - curve.single(sequences)
    curve.per_sequence_ms = max(extra / (sequences - 1), 0.0) if sequences > 1 else 0.0
    # A verified row's argmax reads its whole vocabulary row (262k floats for Gemma): a cost the forward's
    # timing leaves out, and a few percent of a step per draft row at large batches.
    logits = torch.randn(VERIFY_ROWS, runtimes[0].vocab_size, device=runtimes[0].device)

    def argmaxes() -> None:
        for i in range(VERIFY_ROWS):
            greedy_argmax(logits[i : i + 1])

    curve.verify_ms_per_row = best(argmaxes) / VERIFY_ROWS
    return curve
