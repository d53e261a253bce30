#!/usr/bin/env bash
# EAGLE-3 on MT-Bench in one run: the shipped drafter as a chain and as the EAGLE-3 paper's tree (top_k 10,
# depth 7, 60 nodes: the acceptance length that setup reaches, whatever it costs on a CPU), and optionally
# another drafter directory as a chain (e.g. the same weights with a larger draft vocabulary: OTHER=dir).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
mkdir -p "$OUT"
OTHER_CFG=""
if [[ -n "${OTHER:-}" ]]; then
  OTHER_CFG=", {\"method\": \"eagle3\", \"model\": \"$OTHER\", \"num_speculative_tokens\": 5}"
fi
CONFIGS="[
 {\"method\": \"eagle3\", \"model\": \"gemma-3-270m-eagle3\", \"num_speculative_tokens\": 5}$OTHER_CFG,
 {\"method\": \"eagle3\", \"model\": \"gemma-3-270m-eagle3\", \"num_speculative_tokens\": 7, \"tree_top_k\": 10, \"tree_num_draft_tokens\": 60}
]"
.venv/bin/specdec bench --prompts ../shared/data/eval/mt_bench/question.jsonl --limit ${MT_LIMIT:-10} \
  --speculative-config "$CONFIGS" --no-progress --output "$OUT/eagle3-trees-mt_bench.json" > "$OUT/eagle3-trees-mt_bench.txt" 2>&1
echo "$(date +%T) eagle3 trees done"
