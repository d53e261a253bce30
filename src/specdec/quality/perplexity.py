"""Teacher-forced scoring of a text by several targets: perplexity, and how often each target's top-1
token equals the reference target's (bf16) at the same position."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specdec.models.runtime import ModelRuntime

CHUNK = 256  # tokens per forward: bounds the [chunk, vocab] float32 logits (262144 columns for Gemma 3)


@dataclass
class TextScores:
    """Per-position results of one target on one text."""

    nll: list[float] = field(default_factory=list)  # -log p(next token)
    top1: list[int] = field(default_factory=list)  # argmax token at each position


def score_text(runtime: ModelRuntime, ids: list[int]) -> TextScores:
    """Scores ids[1:] given their prefixes, in chunks through the runtime's KV cache."""
    runtime.reset(len(ids) + 1)
    out = TextScores()
    for start in range(0, len(ids) - 1, CHUNK):
        chunk = ids[start : min(start + CHUNK, len(ids) - 1)]
        logits = runtime.forward(chunk).logits.float()
        runtime.commit(list(range(len(chunk))))
        targets = torch.tensor(ids[start + 1 : start + 1 + len(chunk)])
        logp = torch.log_softmax(logits, dim=-1)
        out.nll += (-logp.gather(1, targets[:, None])[:, 0]).tolist()
        out.top1 += logits.argmax(-1).tolist()
    runtime.release()
    return out


def summarize(scores: list[TextScores], reference: list[TextScores] | None) -> dict[str, float]:
    nll = [v for s in scores for v in s.nll]
    result = {"tokens": len(nll), "perplexity": math.exp(sum(nll) / len(nll))}
    if reference is not None:
        same = sum(a == b for s, r in zip(scores, reference) for a, b in zip(s.top1, r.top1))
        result["top1_agreement"] = same / len(nll)
    return result
