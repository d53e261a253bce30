#!/usr/bin/env python3
"""Each shipped drafter on held-out responses of its training data: the trainer's position average of the
step accuracies (1 + a1 + a1 a2 + ...) against a greedy walk over the same responses (training/greedy_walk.py),
and, with --engine, what decoding those prompts measures with the same chain (greedy, the responses' length).

    .venv/bin/python scripts/greedy_walk_validation.py --samples 20 --engine \
        --output benchmarks/results/greedy-walk-validation.json

The responses are the target's own greedy outputs (datasets/), so decoding follows them token for token
wherever the runtime's bits still match generation's. Diagnostic only: nothing here is trained on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec.api import LLM
from specdec.drafting.shipped import resolve_drafter
from specdec.models.loading import load_model
from specdec.sampling_params import SamplingParams
from specdec.training.self_distill import read_data
from specdec.training.trainer import estimated_acceptance_length, split, validate

from teacher_forced_accuracy import objective  # scripts/ is on sys.path when a script here runs

DATA = "datasets/gemma-3-270m-distill-long,datasets/gemma-3-270m-distill-128-s19"
CHAIN = 7  # draft tokens: DFlash B=8's whole block, EAGLE-3's and MTP's chains unrolled as far


def shipped_name(method: str) -> str:
    return "gemma-3-270m-dflash-b8" if method == "dflash" else f"gemma-3-270m-{method}"


def engine_config(method: str, model: str) -> dict:
    if method == "medusa":  # a chain of each head's top token
        return {"method": "medusa", "model": model, "medusa_choices": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]}
    # the whole chain: no confidence threshold (a drafter's stored one would apply otherwise)
    return {"method": method, "model": model, "num_speculative_tokens": CHAIN, "confidence_threshold": 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="dflash,eagle3,mtp,medusa")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--engine", action="store_true", help="also decode the held-out prompts with each drafter")
    ap.add_argument("--model", default=None, help="a drafter directory instead of the shipped one (one method)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model("gemma-3-270m")
    samples = read_data(DATA)
    usable = [s for s in samples if s.response_ids and len(s.prompt_ids) + len(s.response_ids) <= 4608]
    held_out = split(usable, 0.03)[1][: args.samples]
    rows = []
    methods = args.methods.split(",")
    if args.model and len(methods) != 1:
        raise SystemExit("--model replaces one method's drafter: give one --methods")
    for method in methods:
        model = args.model or shipped_name(method)
        v = validate(objective(method, resolve_drafter(model), target, CHAIN, True), held_out)
        row = {"drafter": method, "model": model, "samples": len(held_out),
               "step_accuracy": [round(a, 3) for a in v["step_accuracy"]],
               "position_average": round(estimated_acceptance_length(v["step_accuracy"]), 3),
               "greedy_walk": v.get("greedy_walk_acceptance_length")}
        if args.engine:
            llm = LLM(loaded=target, speculative_config=engine_config(method, model))
            for s in held_out:
                llm.generate({"prompt_token_ids": s.prompt_ids},
                             SamplingParams(temperature=0.0, max_tokens=len(s.response_ids), ignore_eos=True))
            row["decoding"] = round(llm.stats.mean_acceptance_length, 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps({"data": DATA, "chain": CHAIN, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
