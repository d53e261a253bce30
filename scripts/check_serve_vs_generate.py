#!/usr/bin/env python3
"""Greedy outputs over a running `specdec serve` equal those of `specdec generate` for the same prompts.

    python scripts/check_serve_vs_generate.py --base-url http://127.0.0.1:8000 \\
        --speculative-config '{"method": "ngram", "num_speculative_tokens": 5}' \\
        [--prompts ../shared/data/eval/mt_bench/question.jsonl] [--limit 5] [--max-tokens 64] [--output F.json]

Each prompt ("Question: {first turn}\\nAnswer:", as `specdec bench` renders it) goes once to the server's
/v1/completions (temperature 0) and once through a fresh `specdec generate --stats-json` process with the
same model, config and max tokens; the texts and the draft/accepted counts must be equal. Also checks that
the server's /metrics counters grew by exactly the sums of the responses' figures. Exit 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdec.bench.prompts import FIRST_TURN, load_questions  # noqa: E402
from specdec.bench.serve_load import scrape_counters  # noqa: E402


def generate(prompt: str, args: argparse.Namespace) -> tuple[str, dict]:
    cmd = [sys.executable, "-m", "specdec.cli", "generate", prompt, "--max-tokens", str(args.max_tokens),
           "--threads", str(args.threads), "--device", "cpu", "--stats-json"]
    if args.speculative_config:
        cmd += ["--speculative-config", args.speculative_config]
    if args.model:
        cmd += ["--model", args.model]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    text = done.stdout[:-1] if done.stdout.endswith("\n") else done.stdout  # generate ends with a newline
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    return text, stats


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="for `specdec generate` (default: its default model)")
    p.add_argument("--speculative-config", default=None)
    p.add_argument("--prompts", default=str(ROOT.parent / "shared/data/eval/mt_bench/question.jsonl"))
    p.add_argument("--limit", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=None)
    args = p.parse_args()

    base = args.base_url.rstrip("/")
    served = httpx.get(base + "/v1/models").json()["data"][0]["id"]
    prompts = [FIRST_TURN.format(turn=q.turns[0]) for q in load_questions(args.prompts, limit=args.limit)]
    before = scrape_counters(httpx.get(base + "/metrics").text)
    rows, sums = [], {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "completion_tokens": 0}
    for i, prompt in enumerate(prompts):
        r = httpx.post(base + "/v1/completions", timeout=600, json={
            "model": served, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0}).json()
        served_text, spec = r["choices"][0]["text"], r["spec_decoding"]
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            sums[key] += spec[key]
        sums["completion_tokens"] += r["usage"]["completion_tokens"]
        gen_text, stats = generate(prompt, args)
        same = served_text == gen_text and all(spec[k] == stats[k] for k in ("num_draft_tokens", "num_accepted_tokens"))
        rows.append({"prompt": prompt, "identical": same, "server_text": served_text, "generate_text": gen_text,
                     "server_accepted": spec["num_accepted_tokens"], "generate_accepted": stats["num_accepted_tokens"],
                     "server_drafted": spec["num_draft_tokens"], "generate_drafted": stats["num_draft_tokens"],
                     "completion_tokens": r["usage"]["completion_tokens"]})
        print(f"[{i + 1}/{len(prompts)}] {'identical' if same else 'DIFFERENT'}: "
              f"{r['usage']['completion_tokens']} tokens, accepted {spec['num_accepted_tokens']}/"
              f"{spec['num_draft_tokens']} (generate: {stats['num_accepted_tokens']}/{stats['num_draft_tokens']}) "
              f"{prompt[:50]!r}", flush=True)
    after = scrape_counters(httpx.get(base + "/metrics").text)
    names = {"specdec:spec_decode_num_drafts_total": "num_drafts",
             "specdec:spec_decode_num_draft_tokens_total": "num_draft_tokens",
             "specdec:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
             "specdec:generation_tokens_total": "completion_tokens"}
    metrics = {n: {"metrics_delta": int(after[n] - before.get(n, 0)), "sum_of_responses": sums[k]}
               for n, k in names.items()}
    metrics_ok = all(v["metrics_delta"] == v["sum_of_responses"] for v in metrics.values())
    identical = sum(r["identical"] for r in rows)
    print(f"identical to `specdec generate`: {identical}/{len(rows)}; /metrics == sums of responses: {metrics_ok}")
    for name, v in metrics.items():
        print(f"  {name}: delta {v['metrics_delta']}, responses {v['sum_of_responses']}")
    if args.output:
        Path(args.output).write_text(json.dumps({"identical": identical, "prompts": len(rows), "metrics": metrics,
                                                 "metrics_match": metrics_ok, "rows": rows}, indent=2) + "\n")
    return 0 if identical == len(rows) and metrics_ok else 1


if __name__ == "__main__":
    sys.exit(main())
