"""One vLLM decoding mode in its own process, for benchmarks/peers/vllm_interop.py (vLLM's python).

    python vllm_modes.py --job job.json --mode NAME --output result.json

`job.json`: {"model", "prompt_token_ids", "max_tokens", "vllm_modes": {name: speculative config or null},
"max_model_len", optional "ignore_eos", optional "llm_kwargs": {name: extra `LLM(...)` keywords}}. Prompts are decoded one request at a time, greedy, bf16, after one untimed warm-up, with
prefix caching off (the warm-up must not make later prefills free). vLLM's spec-decode counters are read
around each prompt, so the warm-up's drafts are not counted and every prompt has its own counts
(`per_prompt`): acceptance can then be compared on the prompts both engines decode identically.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")


def spec_counters(llm: Any) -> dict[str, Any]:
    """vLLM's `vllm:spec_decode_*` counters (ints, or a list per draft position)."""
    found: dict[str, Any] = {}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:spec_decode_")
        if name in COUNTERS:
            found[name] = list(metric.values) if hasattr(metric, "values") else int(metric.value)
    return found


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = old or [0] * len(value)
            out[name] = [a - b for a, b in zip(value, old)]
        else:
            out[name] = value - (old or 0)
    return out


def run(job: dict[str, Any], mode: str) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    config = job["vllm_modes"][mode]
    kwargs: dict[str, Any] = dict(model=job["model"], dtype="bfloat16", seed=0, enforce_eager=True,
                                  max_model_len=job["max_model_len"], enable_prefix_caching=False,
                                  disable_log_stats=False)
    if config is not None:
        kwargs["speculative_config"] = config
    kwargs.update(job.get("llm_kwargs", {}).get(mode, {}))
    llm = LLM(**kwargs)
    prompts = [{"prompt_token_ids": ids} for ids in job["prompt_token_ids"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=job.get("ignore_eos", False))
    first = before = spec_counters(llm)
    token_ids, per_prompt, seconds = [], [], 0.0
    for p in prompts:
        start = time.perf_counter()
        out = llm.generate([p], params, use_tqdm=False)[0]
        seconds += time.perf_counter() - start  # the counters are read outside the timed part
        token_ids.append(list(out.outputs[0].token_ids))
        after = spec_counters(llm)
        per_prompt.append(counter_delta(before, after))
        before = after
    tokens = sum(len(t) for t in token_ids)
    return {"config": config, "seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds,
            "token_ids": token_ids, "spec_decode": counter_delta(first, before), "per_prompt": per_prompt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", type=Path, required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()
    job = json.loads(args.job.read_text())
    try:
        result = run(job, args.mode)
    except Exception as exc:  # noqa: BLE001 - the parent reports vLLM's own error text
        result = {"error": f"{type(exc).__name__}: {exc}"}
    args.output.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
