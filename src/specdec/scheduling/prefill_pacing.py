"""How many prompt rows a step may prefill while other sequences decode, so that their tokens keep coming.

On a CPU a step's time grows with its rows, so a 512-row prefill chunk makes every decoding stream wait
seconds for its next token. Pacing bounds that: a step with prefill rows should take at most (1 + share)
times a step without them. Both costs are measured on the running server, not modelled: a moving average of
decode-only steps, and of the extra seconds per prefill row in mixed steps (which grows as a long prompt's
context does). Every REFRESH_EVERY-th paced step prefills nothing, to measure the decode-only cost again.
"""

from __future__ import annotations

INITIAL_ROWS = 16  # before the first mixed step is measured
REFRESH_EVERY = 16
SMOOTHING = 0.3  # weight of the newest measurement in the moving averages


class PrefillPacing:
    def __init__(self, share: float) -> None:
        if not share > 0:
            raise ValueError(f"the prefill pacing share must be > 0, got {share}")
        self.share = share
        self.decode_seconds: float | None = None  # a step without prefill rows
        self.row_seconds: float | None = None  # what each prefill row adds to a step
        self.paced_steps = 0

    def rows(self) -> int:
        """Prefill rows for the next step that has decoding sequences (0: measure a decode-only step)."""
        self.paced_steps += 1
        if self.decode_seconds is None or self.paced_steps % REFRESH_EVERY == 0:
            return 0
        if self.row_seconds is None:
            return INITIAL_ROWS
        return max(1, int(self.share * self.decode_seconds / self.row_seconds))

    def observe(self, seconds: float, prefill_rows: int) -> None:
        """A finished step that had decoding sequences, and the prefill rows it ran beside them."""
        if prefill_rows == 0:
            self.decode_seconds = _average(self.decode_seconds, seconds)
        elif self.decode_seconds is not None:
            per_row = max(seconds - self.decode_seconds, 1e-6) / prefill_rows
            self.row_seconds = _average(self.row_seconds, per_row)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
