"""The target's forward cost against the rows it runs: what a draft row costs at a given batch size.

Measured once at start-up on the actual model and machine (a few dozen forwards): `single[n]` is one
sequence forwarding n rows as greedy verification runs them (every row's greedy token, with the LM head
fused with the argmax where the kernels have it, else logits then their argmax), `head[n]` the part of it spent in the LM head (a large
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
from typing import Any
from dataclasses import dataclass

from specdec.engine.sequence import MAX_TOKENS_PER_FORWARD
from specdec.models.runtime import ForwardCall, LogitRows, ModelRuntime, forward_batch

ROW_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class CostCurve:
    rows: list[int]  # ascending
    ms: list[float]  # one sequence forwarding rows[i] rows, each row's greedy token included
    per_sequence_ms: float = 0.0
    head_ms: list[float] | None = None  # the LM head's share of ms[i]; None: unknown (no early-exit saving)

    def single(self, n: int) -> float:
        """ms for one sequence forwarding n rows: piecewise linear, extrapolated past the last point."""
        return _interpolate(self.rows, self.ms, n)

    def head(self, n: float) -> float:
        return _interpolate(self.rows, self.head_ms, n) if self.head_ms is not None else 0.0

    def batch(self, sequences: int, rows: int) -> float:
        return self.single(rows) + max(sequences - 1, 0) * self.per_sequence_ms

    def early_exit(self, rows: int, scored_rows: float) -> float:
        """ms for a lone sequence forwarding `rows` rows whose head is scored for about `scored_rows` only."""
        scored = min(scored_rows, rows)
        return self.single(rows) - self.head(rows) + self.head(scored)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"rows": self.rows, "ms": [round(x, 3) for x in self.ms],
                                  "per_sequence_ms": round(self.per_sequence_ms, 3)}
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


# What the rows read (see measure_cost_curve): a sentence the model continues with confidence once seen.
SAMPLE_TEXT = ("The river runs past the old mill, under the stone bridge and on towards the sea. "
               "Every morning the baker opens his shop at six and sells bread to the fishermen. ")


def sample_tokens(tokenizer: Any) -> list[int]:
    """SAMPLE_TEXT's token ids, or [] where the tokenizer cannot encode it."""
    try:
        return [int(t) for t in tokenizer.encode(SAMPLE_TEXT, add_special_tokens=False)]
    except Exception:  # a stub or unusual tokenizer: the curve then reads a cycle of ids
        return []


def _cycle(text: Sequence[int], start: int, n: int) -> list[int]:
    """Tokens start.. of `text` repeated (or of a 100-token cycle of ids when there is none)."""
    if len(text) < 8:
        return [1 + (i % 100) for i in range(start, start + n)]
    return [text[i % len(text)] for i in range(start, start + n)]


# Timing passes (see measure_cost_curve): each pass times every forward once, in turn, and a forward's time
# is its fastest pass. A burst of load on the machine (another process for 1.5 s) slows the forwards it
# overlaps: timed back to back, the same forward's repeats all fell in it, and a curve measured that way read
# 82-96 ms against 28-32 ms (and is never measured again). Interleaved, a burst spoils a few passes of every
# forward at most, and passes go on until one improves no time by more than SETTLED (a burst slowed them
# 2-3x): the burst is over.
MIN_PASSES = 2  # timed passes at least (after one that warms up)
MAX_PASSES = 8  # timed passes at most: a machine loaded throughout is what it is
SETTLED = 0.10  # a pass that brings no time down by more than this share ends the measurement


def measure_cost_curve(new_runtime: Callable[[], ModelRuntime], capacity: int = 512,
                       row_counts: Sequence[int] = ROW_COUNTS, min_passes: int = MIN_PASSES,
                       context: int = 128, sequences: int = 8, text: Sequence[int] = (),
                       max_passes: int = MAX_PASSES) -> CostCurve:
    """Times forwards of n rows after a `context`-token prefix in a `capacity`-slot cache, then a batch of
    `sequences` one-row sequences for the per-sequence overhead: each its fastest of the timing passes
    (MIN_PASSES to MAX_PASSES). The prefix and rows repeat `text` (token ids, e.g. of SAMPLE_TEXT), so the
    rows are predicted confidently, as in real decoding: the greedy head's int8 screen
    (greedy_argmax.head_screen) then rechecks a few columns a row, where arbitrary token ids left it
    thousands and the curve priced every row too high."""
    counts = [n for n in row_counts if context + n <= capacity]
    runtimes = [new_runtime() for _ in range(sequences)]
    for rt in runtimes:
        rt.reset(capacity)
        rt.prefill(_cycle(text, 0, context))

    def verified(tokens: list[int], logit_rows: LogitRows = "all") -> ForwardCall:
        # as greedy verification asks (engine/step.py): the tokens, not the logits
        return ForwardCall(tokens, logit_rows=logit_rows, argmax=True, logits=False)

    def single(n: int, logit_rows: LogitRows = "all") -> None:
        forward_batch(runtimes[:1], [verified(_cycle(text, context, n), logit_rows)])
        runtimes[0].truncate(context)

    def batched() -> None:
        forward_batch(runtimes, [verified(_cycle(text, context, 1)) for _ in runtimes])
        for rt in runtimes:
            rt.truncate(context)

    # without logits: what early exit saves; only a lone sequence (at most one forward's rows) uses it
    bodies = [n for n in counts if n <= MAX_TOKENS_PER_FORWARD]
    runs: list[Callable[[], None]] = [lambda n=n: single(n) for n in counts]
    runs += [lambda n=n: single(n, None) for n in bodies]
    runs += [batched] if sequences > 1 else []
    fastest = _fastest_of_passes(runs, min_passes, max_passes)
    ms = fastest[: len(counts)]
    # never falls with more rows: timing noise made 2 rows 2 ms cheaper than 1 (of 37), and the auto policy
    # then counted a draft row as a saving
    ms = [max(ms[: i + 1]) for i in range(len(ms))]
    body = fastest[len(counts) : len(counts) + len(bodies)]
    head = [max(m - b, 0.0) for m, b in zip(ms, body)]
    head = [max(head[: i + 1]) for i in range(len(head))]  # never falls with more rows (timing noise)
    head += [ms[i] * head[-1] / ms[len(head) - 1] for i in range(len(head), len(ms))]  # the same share
    curve = CostCurve(list(counts), ms, head_ms=head)
    if sequences > 1:
        curve.per_sequence_ms = max((fastest[-1] - curve.single(sequences)) / (sequences - 1), 0.0)
    return curve


def _fastest_of_passes(runs: Sequence[Callable[[], None]], min_passes: int, max_passes: int) -> list[float]:
    """Each run's fastest time in ms over interleaved passes: one untimed pass, then timed ones until a pass
    past the first `min_passes` improves no run's time by more than SETTLED (or max_passes)."""
    for run in runs:  # warms up
        run()
    fastest = [float("inf")] * len(runs)
    for p in range(max(max_passes, min_passes)):
        improved = False
        for i, run in enumerate(runs):
            t = time.perf_counter()
            run()
            elapsed = (time.perf_counter() - t) * 1000
            improved |= elapsed < fastest[i] * (1 - SETTLED)
            fastest[i] = min(fastest[i], elapsed)
        if p + 1 >= min_passes and not improved:
            break
    return fastest
