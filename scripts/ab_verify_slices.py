#!/usr/bin/env python3
"""A/B of greedy verification by vocabulary slices (verification/greedy_early_exit.py) against scoring the
whole LM head, in one process: plain and speculative decoding of the same prompts, best of 3 runs each way.

    .venv/bin/python scripts/ab_verify_slices.py mt '{"method": "ngram", "num_speculative_tokens": 5}'
    .venv/bin/python scripts/ab_verify_slices.py summarization '{"method": "eagle3", "model": "gemma-3-270m-eagle3"}'

`mt`: the first turns of MT-Bench's first 8 questions; otherwise 4 prompts of that category of
benchmarks/prompts/other_kinds.jsonl. Prints the seconds of each mode and whether every output matched.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from specdec.api import LLM
from specdec.bench.prompts import load_questions, render_prompt
from specdec.models.loading import load_model
from specdec.models.runtime import NativeRuntime
from specdec.sampling_params import SamplingParams


def main() -> None:
    torch.set_num_threads(2)
    kind = sys.argv[1] if len(sys.argv) > 1 else "mt"
    config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {"method": "ngram", "num_speculative_tokens": 5}
    loaded = load_model("gemma-3-270m", dtype="bfloat16")
    questions = (load_questions("../shared/data/eval/mt_bench/question.jsonl")[:8] if kind == "mt" else
                 [q for q in load_questions("benchmarks/prompts/other_kinds.jsonl") if q.category == kind][:4])
    prompts = [render_prompt(loaded.tokenizer, [q.turns[0]], []) for q in questions]
    params = SamplingParams(max_tokens=128, temperature=0.0)
    slices = NativeRuntime.scores_head_slices
    llms = {"plain": LLM(loaded=loaded), "speculative": LLM(loaded=loaded, speculative_config=config)}
    seconds: dict[tuple[str, bool], float] = {}
    outputs: dict[tuple[str, bool, int], list[int]] = {}
    for _ in range(3):
        for sliced in (True, False):
            NativeRuntime.scores_head_slices = slices if sliced else property(lambda self: False)
            for name, llm in llms.items():
                start = time.perf_counter()
                for i, prompt in enumerate(prompts):
                    (out,) = llm.generate([{"prompt_token_ids": prompt}], params)
                    outputs[(name, sliced, i)] = out.outputs[0].token_ids
                seconds[(name, sliced)] = min(seconds.get((name, sliced), 1e9), time.perf_counter() - start)
    NativeRuntime.scores_head_slices = slices
    for (name, sliced), s in seconds.items():
        print(f"{name:12s} {'slices' if sliced else 'whole head':10s} {s:.3f} s")
    same = all(v == outputs[("plain", False, k[2])] for k, v in outputs.items())
    print(f"identical: {same}")
    for sliced in (True, False):
        print(f"speedup with {'slices' if sliced else 'the whole head'}: "
              f"{seconds[('plain', sliced)] / seconds[('speculative', sliced)]:.3f}")


if __name__ == "__main__":
    main()
