"""Where two generations part, and how close the target's decision was there.

A greedy mismatch at a position where the target's top-2 logits are nearly tied is floating-point noise
(the two runs computed that position through different kernels or batch shapes); a mismatch with a
clear margin means the speculative path produced a token the target would not have chosen: a bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.engine.loop import cache_capacity
from specdec.models.runtime import ModelRuntime


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the two id lists differ (or where the shorter one ends); None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class Divergence:
    position: int
    baseline_token: int | None  # None when the baseline output ended there
    other_token: int | None  # the compared output's token (speculative, or transformers')
    logit_margin: float  # target's top-1 minus top-2 logit at `position`
    target_token: int  # the target's argmax there (equals baseline_token under greedy on an exact runtime)
    logit_gap: float | None  # target's logit of baseline_token minus that of other_token (None if either ended)

    def to_dict(self, other: str = "speculative") -> dict:
        return {
            "baseline_token": self.baseline_token,
            f"{other}_token": self.other_token,
            "target_token": self.target_token,
            "logit_gap": self.logit_gap,
        }


@torch.inference_mode()
def target_logits(runtime: ModelRuntime, context: Sequence[int]) -> torch.Tensor:
    """The target's next-token logits after `context`, by one prefill on `runtime` (its cache is reset)."""
    runtime.reset(cache_capacity(len(context), 1))
    result = runtime.prefill(list(context))
    assert result.logits is not None
    return result.logits[-1].float()


def diagnose(
    runtime: ModelRuntime, prompt: Sequence[int], baseline: Sequence[int], other: Sequence[int]
) -> Divergence | None:
    """Finds the first divergence and the target's logit margin there (prompt + common prefix)."""
    position = first_divergence(baseline, other)
    if position is None:
        return None
    logits = target_logits(runtime, [*prompt, *baseline[:position]])
    top = torch.topk(logits, 2).values
    base = int(baseline[position]) if position < len(baseline) else None
    alt = int(other[position]) if position < len(other) else None
    return Divergence(
        position=position,
        baseline_token=base,
        other_token=alt,
        logit_margin=float(top[0] - top[1]),
        target_token=int(logits.argmax()),  # argmax, not topk: ties resolve like greedy decoding does
        logit_gap=None if base is None or alt is None else round(float(logits[base] - logits[alt]), 4),
    )
