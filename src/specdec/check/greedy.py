"""The greedy half of the gate: every case decoded plain and speculatively, batched, then compared token for token.

Both modes run all cases through the continuous-batching scheduler with at most `batch_size` running (a
sequence's tokens do not depend on what shares its forward, so batched plain output is the reference). A
case whose speculative output differs is diagnosed where the two part: the target's top-2 logit margin
there and the text around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.api import LLM
from specdec.bench.batched import run_offline
from specdec.bench.divergence import diagnose
from specdec.check.cases import CheckCase
from specdec.engine.stats import SpecDecodingStats
from specdec.models.runtime import ModelRuntime
from specdec.sampling_params import SamplingParams

CONTEXT_TOKENS = 12  # tokens of agreed text shown before a divergence


@dataclass
class GreedyRun:
    tokens: list[list[int]]  # per case, the generated ids
    seconds: float  # wall time of the whole batched run
    stats: SpecDecodingStats


def run_greedy(llm: LLM, prompts: Sequence[list[int]], max_new_tokens: int, batch_size: int,
               desc: str, progress: bool) -> GreedyRun:
    from tqdm import tqdm

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    with tqdm(total=len(prompts), desc=desc, disable=not progress, leave=False) as bar:
        run = run_offline(llm, prompts, params, batch_size, bar)
    return GreedyRun(run["tokens"], run["seconds"], run["stats"])


def divergences(runtime: ModelRuntime, tokenizer: Any, cases: Sequence[CheckCase], prompts: Sequence[list[int]],
                plain: GreedyRun, spec: GreedyRun) -> list[dict[str, Any]]:
    """One entry per case whose speculative output is not its plain output."""
    found = []
    for case, prompt, a, b in zip(cases, prompts, plain.tokens, spec.tokens):
        d = diagnose(runtime, prompt, a, b)
        if d is None:
            continue
        before = [*prompt, *a[: d.position]][-CONTEXT_TOKENS:]
        found.append({
            "id": case.id,
            "kind": case.kind,
            "position": d.position,
            "logit_margin": round(d.logit_margin, 4),
            **d.to_dict(),
            "context": tokenizer.decode(before),
            "plain_text": _piece(tokenizer, d.baseline_token),
            "speculative_text": _piece(tokenizer, d.other_token),
        })
    return found


def _piece(tokenizer: Any, token: int | None) -> str:
    return "<end>" if token is None else tokenizer.decode([token])
