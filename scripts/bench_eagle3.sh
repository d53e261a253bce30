#!/usr/bin/env bash
# EAGLE-3 chains and trees against plain decoding on both prompt sets, on a quiet machine.
# Usage: scripts/bench_eagle3.sh [drafter dir or name] ; reports in benchmarks/results/ (JSON + printed tables).
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFTER=${1:-gemma-3-270m-eagle3}
OUT=benchmarks/results
mkdir -p "$OUT"
MT=../shared/data/eval/mt_bench/question.jsonl
OTHER=benchmarks/prompts/other_kinds.jsonl
CHAIN="{\"method\": \"eagle3\", \"model\": \"$DRAFTER\", \"num_speculative_tokens\": 5}"
TREE="{\"method\": \"eagle3\", \"model\": \"$DRAFTER\", \"num_speculative_tokens\": ${TREE_DEPTH:-6}, \"tree_top_k\": ${TREE_TOP_K:-4}, \"tree_num_draft_tokens\": ${TREE_NODES:-12}}"
bench() {  # name prompts configs-json [extra args...]
  local name=$1 prompts=$2 config=$3; shift 3
  .venv/bin/specdec bench --prompts "$prompts" --speculative-config "$config" --no-progress \
    --output "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  echo "$(date +%T) $name: $(tail -n 1 "$OUT/$name.txt" | cut -c1-300)"
}
bench mt_bench-eagle3 "$MT" "[$CHAIN, $TREE]"
bench other_kinds-eagle3 "$OTHER" "[$CHAIN, $TREE]"
