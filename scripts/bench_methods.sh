#!/usr/bin/env bash
# Every method against plain decoding on both prompt sets, one after another on a quiet machine.
# Reports land in benchmarks/results/ (JSON) with the printed tables beside them (.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
mkdir -p "$OUT"
MT=../shared/data/eval/mt_bench/question.jsonl
OTHER=benchmarks/prompts/other_kinds.jsonl
bench() {  # name prompts config [extra args...]
  local name=$1 prompts=$2 config=$3; shift 3
  .venv/bin/specdec bench --prompts "$prompts" --speculative-config "$config" --no-progress \
    --output "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  echo "$(date +%T) $name: $(tail -n 1 "$OUT/$name.txt" | cut -c1-200)"
}
bench other_kinds-ngram5 "$OTHER" '{"method": "ngram", "num_speculative_tokens": 5}' --include-transformers
bench mt_bench-ngram5 "$MT" '{"method": "ngram", "num_speculative_tokens": 5}'
for k in 1 3 8; do
  bench sweep-mt10-ngram$k "$MT" "{\"method\": \"ngram\", \"num_speculative_tokens\": $k}" --limit 10
done
for n in 2 4 6 9 12; do
  bench sweep-mt10-self$n-k3 "$MT" "{\"method\": \"draft_model\", \"model\": \"self:$n\", \"num_speculative_tokens\": 3}" --limit 10
done
