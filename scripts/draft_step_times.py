"""Per-step wall times of a speculative config at batch 1, grouped by the draft length the policy chose, beside
plain decoding of the same prompts in the same process: where `"auto"` drafts, and what a drafted step costs.

    .venv/bin/python scripts/draft_step_times.py '{"method": "dflash", "model": "gemma-3-270m-dflash-b16"}'

One prompt per kind of benchmarks/prompts/other_kinds.jsonl (4), greedy, 128 new tokens. Prints the end-to-end
ratio, identity with plain, the median step time per chosen length and the policy's final state.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import specdec.scheduling.scheduler as scheduler
from specdec import LLM, SamplingParams

PROMPTS = Path(__file__).resolve().parent.parent / "benchmarks/prompts/other_kinds.jsonl"


def one_per_kind() -> list[str]:
    first: dict[str, str] = {}
    for line in PROMPTS.read_text().splitlines():
        row = json.loads(line)
        first.setdefault(row["category"], row["turns"][0])
    return [f"Question: {p}\nAnswer:" for p in first.values()]


def timed(llm: LLM, prompts: Sequence[str], params: SamplingParams) -> tuple[float, list, list[tuple[int, float]]]:
    """Generates the prompts one at a time; returns the seconds, the outputs and (draft length, step seconds)
    of every decoding step (-1: a step that only reads a prompt)."""
    steps: list[tuple[int, float]] = []
    run_step: Callable[..., Any] = scheduler.run_step

    def spy(work: Sequence[Any]) -> Any:
        t = time.perf_counter()
        out = run_step(work)
        decoding = [w for w in work if not w.seq.prefilling]
        steps.append((decoding[0].draft_limit if decoding else -1, time.perf_counter() - t))
        return out

    llm.generate(list(prompts[:1]), SamplingParams(temperature=0.0, max_tokens=8))  # warm-up, cost curve
    scheduler.run_step = spy
    try:
        t = time.perf_counter()
        outs = [llm.generate([p], params)[0] for p in prompts]
        return time.perf_counter() - t, outs, steps
    finally:
        scheduler.run_step = run_step


def main(config: str) -> None:
    prompts, params = one_per_kind(), SamplingParams(temperature=0.0, max_tokens=128)
    plain = LLM()
    plain_s, plain_outs, _ = timed(plain, prompts, params)
    spec = LLM(loaded=plain.model, speculative_config=json.loads(config))
    spec_s, spec_outs, steps = timed(spec, prompts, params)
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(plain_outs, spec_outs))
    print(f"plain {plain_s:.2f} s, speculative {spec_s:.2f} s: {plain_s / spec_s:.3f}x, identical {same}/{len(prompts)}")
    by_length: dict[int, list[float]] = defaultdict(list)
    for k, seconds in steps:
        by_length[k].append(seconds * 1000)
    for k in sorted(by_length):
        ms = by_length[k]
        label = "prompt" if k < 0 else f"k={k}"
        print(f"{label:>7}: {len(ms):4d} steps, median {statistics.median(ms):7.1f} ms, {sum(ms) / 1000:6.2f} s in all")
    print(json.dumps(spec.draft_length_policy.describe()))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
