"""specdec's half of benchmarks/peers/vllm_interop.py, run with the *project's* python.

    .venv/bin/python benchmarks/peers/specdec_side.py --job job.json --output ours.json

`job.json`: {"model", "prompt_token_ids": [[...]], "max_tokens", "modes": {name: speculative config or
null}, "others": {label: [[token ids per prompt]]}}. Each mode decodes the prompts one at a time, greedy,
after one untimed warm-up; the result holds each mode's token ids, seconds, tok/s and statistics. Every
output of `others` (vLLM's) that differs from our plain output gets the first differing position and
the target's top-2 logit margin there (`specdec.bench.divergence.diagnose`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from specdec import LLM, SamplingParams
from specdec.bench.divergence import diagnose
from specdec.engine.stats import SpecDecodingStats
from specdec.models.loading import LoadedModel, load_model


def run_mode(target: LoadedModel, config: dict[str, Any] | None, prompts: list[list[int]], max_tokens: int) -> dict:
    llm = LLM(loaded=target, speculative_config=config)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
    total, token_ids, per_prompt = SpecDecodingStats(), [], []
    start = time.perf_counter()
    for ids in prompts:
        out = llm.generate({"prompt_token_ids": ids}, params)[0]
        token_ids.append(list(out.outputs[0].token_ids))
        total.merge(out.spec_decoding_stats)
        per_prompt.append(out.spec_decoding_stats)
    seconds = time.perf_counter() - start
    tokens = sum(len(t) for t in token_ids)
    return {"config": config, "seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds,
            "token_ids": token_ids, "stats": total.to_dict(), "per_prompt": [s.to_dict() for s in per_prompt]}


def divergences(target: LoadedModel, prompts: list[list[int]], ours: list[list[int]],
                theirs: list[list[int]]) -> list[dict]:
    runtime = target.new_runtime()
    found = []
    for i, (prompt, a, b) in enumerate(zip(prompts, ours, theirs)):
        d = diagnose(runtime, prompt, a, b)
        if d is not None:
            found.append({"prompt": i, "position": d.position, "top2_logit_margin": round(d.logit_margin, 4),
                          **d.to_dict("vllm")})
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", type=Path, required=True)
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()
    job = json.loads(args.job.read_text())
    target = load_model(job["model"], dtype="bfloat16")
    prompts, result = job["prompt_token_ids"], {"modes": {}, "divergences": {}}
    for name, config in job["modes"].items():
        result["modes"][name] = run_mode(target, config, prompts, job["max_tokens"])
        r = result["modes"][name]
        print(f"specdec {name}: {r['tokens']} tokens in {r['seconds']:.1f}s = {r['tok_per_s']:.1f} tok/s", flush=True)
    plain = result["modes"]["plain"]["token_ids"]
    for label, theirs in job.get("others", {}).items():
        result["divergences"][label] = divergences(target, prompts, plain, theirs)
    args.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
