"""Speculative-decoding statistics, per request and aggregated; read by the CLI, the bench and the server.

Conventions: a verification step is one target forward after the prompt (a plain decoding step is a
verification step with an empty draft). Mean acceptance length = (accepted draft tokens + 1 per step) /
steps, i.e. tokens produced per target forward, 1.0 for plain decoding (Spec-Bench's and EAGLE's tau).
vLLM divides by drafts instead of steps; the two agree when every step has a draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecDecodingStats:
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_steps: int = 0  # target forwards after the prompt (verification steps)
    num_drafts: int = 0  # steps that had a non-empty draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: steps whose draft token i was accepted
    drafted_per_position: list[int] = field(default_factory=list)  # [i]: steps that drafted a token at position i
    # [k]: verification steps whose draft-length policy allowed k draft tokens (scheduling/draft_length.py)
    chosen_draft_lengths: list[int] = field(default_factory=list)
    steps_since_allowed: int = 0  # consecutive steps whose policy allowed no draft (not merged or reported)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0  # the drafter's time, catching up included
    catch_up_seconds: float = 0.0  # the part of it spent catching up (Proposer.catch_up_batch)
    verify_seconds: float = 0.0
    total_seconds: float = 0.0

    def record_step(self, num_draft: int, num_accepted: int, positions: int | None = None) -> None:
        """`positions`: how many draft positions the step offered; a chain's length (the default) or a
        tree's depth, so acceptance per position reads the same for both."""
        self.num_steps += 1
        if num_draft:
            self.num_drafts += 1
            self.num_draft_tokens += num_draft
            self.num_accepted_tokens += num_accepted
        _add_ones(self.drafted_per_position, num_draft if positions is None else positions)
        _add_ones(self.accepted_per_position, num_accepted)

    def merge(self, other: SpecDecodingStats) -> SpecDecodingStats:
        for name in (
            "num_requests num_prompt_tokens num_generated_tokens num_steps num_drafts num_draft_tokens "
            "num_accepted_tokens prefill_seconds draft_seconds catch_up_seconds verify_seconds total_seconds"
        ).split():
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.accepted_per_position = _add_lists(self.accepted_per_position, other.accepted_per_position)
        self.drafted_per_position = _add_lists(self.drafted_per_position, other.drafted_per_position)
        self.chosen_draft_lengths = _add_lists(self.chosen_draft_lengths, other.chosen_draft_lengths)
        return self

    def record_choice(self, length: int) -> None:
        self.steps_since_allowed = 0 if length else self.steps_since_allowed + 1
        if len(self.chosen_draft_lengths) <= length:
            self.chosen_draft_lengths.extend([0] * (length + 1 - len(self.chosen_draft_lengths)))
        self.chosen_draft_lengths[length] += 1

    @property
    def mean_chosen_draft_length(self) -> float:
        steps = sum(self.chosen_draft_lengths)
        return sum(k * n for k, n in enumerate(self.chosen_draft_lengths)) / steps if steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return (self.num_accepted_tokens + self.num_steps) / self.num_steps if self.num_steps else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        accepted = self.accepted_per_position + [0] * (len(self.drafted_per_position) - len(self.accepted_per_position))
        return [a / d if d else 0.0 for a, d in zip(accepted, self.drafted_per_position)]

    @property
    def tokens_per_second(self) -> float:
        return self.num_generated_tokens / self.total_seconds if self.total_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_requests": self.num_requests,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "num_steps": self.num_steps,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate_per_position": [round(x, 4) for x in self.acceptance_rate_per_position],
            "chosen_draft_lengths": list(self.chosen_draft_lengths),
            "mean_chosen_draft_length": round(self.mean_chosen_draft_length, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "prefill_seconds": round(self.prefill_seconds, 4),
            "draft_seconds": round(self.draft_seconds, 4),
            "catch_up_seconds": round(self.catch_up_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "total_seconds": round(self.total_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
        }

    def summary_line(self) -> str:
        """llama.cpp-style one-liner."""
        return (
            f"draft acceptance rate = {self.acceptance_rate:.5f} ({self.num_accepted_tokens:5d} accepted / "
            f"{self.num_draft_tokens:5d} drafted), mean acceptance length = {self.mean_acceptance_length:.2f}, "
            f"{self.num_generated_tokens} tokens in {self.total_seconds:.2f} s = {self.tokens_per_second:.1f} tok/s "
            f"(draft {self.draft_seconds:.2f} s, verify {self.verify_seconds:.2f} s, prefill {self.prefill_seconds:.2f} s)"
        )


def _add_ones(counts: list[int], n: int) -> None:
    if len(counts) < n:
        counts.extend([0] * (n - len(counts)))
    for i in range(n):
        counts[i] += 1


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    out = a + [0] * (len(b) - len(a)) if len(b) > len(a) else list(a)
    for i, x in enumerate(b):
        out[i] += x
    return out
