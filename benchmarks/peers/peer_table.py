"""The peer table: specdec, transformers, llama.cpp and vLLM at batch 1 on the same prompts, from one run
of scripts/bench_peers.sh.

    .venv/bin/python benchmarks/peers/peer_table.py --bf16 peers-bf16.json --gguf peers-gguf.json \\
        --vllm vllm-b1.json --output peers.md

`peers-bf16.json`: `specdec bench --include-transformers` (bf16); `peers-gguf.json`: `specdec bench
--quantization gguf --include-llama-cpp` (the GGUF file's Q4_K_M blocks, which llama.cpp runs too);
`vllm-b1.json`: benchmarks/peers/vllm_cpu_batched.py --modes plain,ngram (bf16, one request at a time).
Every speed is put against specdec's bf16 plain decoding in the same script run. Identity is counted against
our plain output with the same weights: bf16 rows against bf16 plain (vLLM's through the first run's
per-prompt token ids, which `specdec bench --output` does not keep, so vLLM's are checked against
`--reference`, a batched bench report's batch-1 plain ids on the same prompts), Q4_K_M rows against our
gguf plain.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _rows(report: dict[str, Any], weights: str) -> list[tuple[str, str, str, float, str]]:
    o = report["overall"]
    n = o["prompts"]
    method = report["speculative_config"].get("method", "?")
    k = report["speculative_config"].get("num_speculative_tokens", "")
    rows = [("specdec", weights, "plain", o["baseline_tokens_per_second"], "reference"),
            ("specdec", weights, f"{method} (k={k})", o["speculative_tokens_per_second"], f"{o['identical']}/{n}")]
    for peer, name in (("transformers", "transformers"), ("llama_cpp", "llama.cpp")):
        for mode, row in (report.get(peer) or {}).items():
            k_lookup = row.get("num_pred_tokens", row.get("prompt_lookup_num_tokens"))
            label = "greedy" if mode == "greedy" else f"prompt lookup (K={k_lookup})"
            rows.append((name, weights, label, row["tokens_per_second"], f"{row['identical_to_plain']}/{n}"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bf16", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--vllm", type=Path, default=None)
    ap.add_argument("--reference", type=Path, default=None, help="a `bench --batch-size` report on the same prompts")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    bf16, gguf = json.loads(args.bf16.read_text()), json.loads(args.gguf.read_text())
    base = bf16["overall"]["baseline_tokens_per_second"]
    n = bf16["overall"]["prompts"]
    rows = _rows(bf16, "bf16") + _rows(gguf, "Q4_K_M")
    if args.vllm is not None:
        vllm = json.loads(args.vllm.read_text())
        ref = json.loads(args.reference.read_text())["reference_token_ids"][:n] if args.reference else None
        for mode in ("plain", "ngram"):
            run = vllm.get(mode)
            if not isinstance(run, dict) or "tok_per_s" not in run:
                continue
            same = f"{sum(a == b for a, b in zip(run['token_ids'], ref))}/{n}" if ref else "?"
            rows.append((f"vLLM {vllm.get('vllm_version', '')}".strip(), "bf16",
                         "plain" if mode == "plain" else "n-gram (k=5)", run["tok_per_s"], same))
    lines = [f"{n} prompts, {bf16['max_new_tokens']} new tokens, greedy, batch 1, one run",
             "",
             "| engine | weights | mode | tok/s | x specdec bf16 plain | identical to specdec plain, same weights |",
             "|---|---|---|---|---|---|"]
    for engine, weights, mode, tps, same in rows:
        lines.append(f"| {engine} | {weights} | {mode} | {tps:.1f} | {tps / base:.2f}x | {same} |")
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
