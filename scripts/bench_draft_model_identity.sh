#!/usr/bin/env bash
# Greedy identity of the draft_model method (self-draft) on both prompt sets, full length.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
CONFIG=${1:-'{"method": "draft_model", "model": "self:9", "num_speculative_tokens": 3}'}
NAME=${2:-self9-k3}
for set in other_kinds mt_bench; do
  prompts=benchmarks/prompts/other_kinds.jsonl
  [ "$set" = mt_bench ] && prompts=../shared/data/eval/mt_bench/question.jsonl
  .venv/bin/specdec bench --prompts "$prompts" --speculative-config "$CONFIG" --no-progress \
    --output "$OUT/$set-$NAME.json" > "$OUT/$set-$NAME.txt" 2>&1
  echo "$(date +%T) $set-$NAME: $(tail -n 1 "$OUT/$set-$NAME.txt" | cut -c1-200)"
done
