#!/usr/bin/env bash
# MTP chains against MTP dynamic trees, and the DFlash B=8 drafter (chain, threshold, tree) beside the EAGLE-3
# chain it is compared with, in one bench run per prompt set (each method right after the same plain run of
# each prompt). Run on a quiet machine. Reports: benchmarks/results/mtp-trees-dflash-*.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
mkdir -p "$OUT"
MT=../shared/data/eval/mt_bench/question.jsonl
OTHER=benchmarks/prompts/other_kinds.jsonl
CONFIGS='[
 {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 8, "confidence_threshold": 0.45},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "confidence_threshold": 0.4},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "tree_top_k": 3, "tree_num_draft_tokens": 10},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "tree_top_k": 3, "tree_num_draft_tokens": 8, "confidence_threshold": 0.2},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 5, "tree_top_k": 2, "tree_num_draft_tokens": 6, "confidence_threshold": 0.2},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7, "confidence_threshold": 0.3},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7, "tree_top_k": 3, "tree_num_draft_tokens": 10}
]'
bench() {  # name prompts [extra args...]
  local name=$1 prompts=$2; shift 2
  .venv/bin/specdec bench --prompts "$prompts" --speculative-config "$CONFIGS" --no-progress \
    --output "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  echo "$(date +%T) $name done"
}
bench mtp-trees-dflash-mt_bench "$MT" --limit ${MT_LIMIT:-10}
bench mtp-trees-dflash-other_kinds "$OTHER"
