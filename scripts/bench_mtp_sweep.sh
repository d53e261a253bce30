#!/usr/bin/env bash
# MTP chain settings on MT-Bench (first 10 questions x 2 turns), one run: the settings are chosen here and
# then measured on the other kinds by bench_all_methods.sh. Reports in benchmarks/results/mtp-sweep-*.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIGS='[
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 5, "confidence_threshold": 0.3},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "confidence_threshold": 0.3},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "confidence_threshold": 0.4},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 8, "confidence_threshold": 0.3}
]'
.venv/bin/specdec bench --prompts ../shared/data/eval/mt_bench/question.jsonl --limit 10 \
  --speculative-config "$CONFIGS" --no-progress --output benchmarks/results/mtp-sweep-mt_bench.json \
  > benchmarks/results/mtp-sweep-mt_bench.txt 2>&1
echo "$(date +%T) mtp sweep done"
