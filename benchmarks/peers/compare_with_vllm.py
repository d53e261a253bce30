"""Side by side: specdec's batched bench and vLLM's CPU build on the same prompts, from one run of both.

    .venv/bin/python benchmarks/peers/compare_with_vllm.py --specdec bench.json --vllm vllm.json \\
        --batch-size 32 --output table.txt

`bench.json` is `specdec bench --batch-size ...` output (it holds specdec's batch-1 plain token ids);
`vllm.json` is benchmarks/peers/vllm_cpu_batched.py output on the same prompts. Every output, ours and
vLLM's, is checked against specdec's batch-1 plain output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specdec", required=True, type=Path)
    ap.add_argument("--vllm", required=True, type=Path)
    ap.add_argument("--batch-size", type=int, required=True, help="specdec's rows at this batch size")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    ours, theirs = json.loads(args.specdec.read_text()), json.loads(args.vllm.read_text())
    reference = ours["reference_token_ids"]
    vllm_plain = theirs.get("plain-batched", {}).get("token_ids")
    lines = [f"{len(reference)} prompts, {ours['max_new_tokens']} new tokens, greedy; vLLM {theirs.get('vllm_version')}",
             f"{'engine / mode':<40} {'tok/s':>8} {'identical to specdec B=1 plain':>32} {'to vLLM plain':>14}"]
    for row in ours["rows"]:
        if row["batch_size"] == args.batch_size:
            lines.append(f"{'specdec ' + row['mode'] + f' B={args.batch_size}':<40} {row['output_tokens_per_second']:>8.1f} "
                         f"{row['identical']:>29}/{len(reference)} {'':>14}")
    for mode, run in theirs.items():
        if not isinstance(run, dict) or "token_ids" not in run:
            continue
        same = sum(a == b for a, b in zip(run["token_ids"], reference))
        own = sum(a == b for a, b in zip(run["token_ids"], vllm_plain)) if vllm_plain else None
        lines.append(f"{'vLLM ' + mode:<40} {run['tok_per_s']:>8.1f} {same:>29}/{len(reference)} "
                     f"{'' if own is None else f'{own}/{len(reference)}':>14}")
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
