#!/usr/bin/env bash
# Every method on the held-out sets, in one bench run per prompt set (each method right after the same plain
# run of each prompt): benchmarks/prompts/held_out.jsonl (long articles, multi-passage RAG, multi-turn chat,
# code, math, translation both ways) and benchmarks/prompts/other_kinds.jsonl. Reports in
# benchmarks/results/<NAME>-<set>.{json,txt}. CONFIGS, NAME, THREADS and OTHER_SELECT (environment) override
# the defaults; THREADS=1 leaves the other core to another job (ratios stay comparable within the run).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
mkdir -p "$OUT"
EAGLE=${EAGLE:-gemma-3-270m-eagle3}
DEFAULT_CONFIGS='[
 {"method": "ngram", "num_speculative_tokens": 5},
 {"method": "hybrid", "selection": "fixed", "prompt_lookup_min": 3, "fallback": {"method": "eagle3", "model": "'$EAGLE'", "num_speculative_tokens": 6, "confidence_threshold": 0.6}},
 {"method": "hybrid", "selection": "adaptive", "prompt_lookup_min": 2, "fallback": {"method": "eagle3", "model": "'$EAGLE'", "num_speculative_tokens": 6, "confidence_threshold": 0.6}},
 {"method": "eagle3", "model": "'$EAGLE'", "num_speculative_tokens": 8, "confidence_threshold": 0.45},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "confidence_threshold": 0.4},
 {"method": "medusa", "model": "gemma-3-270m-medusa", "tree_top_k": 6, "tree_num_draft_tokens": 16},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7, "confidence_threshold": 0.3}
]'
CONFIGS=${CONFIGS:-$DEFAULT_CONFIGS}
NAME=${NAME:-held-out}
THREADS=${THREADS:-}
bench() {  # name prompts [extra args...]
  local name=$1 prompts=$2; shift 2
  .venv/bin/specdec bench --prompts "$prompts" --speculative-config "$CONFIGS" --no-progress \
    ${THREADS:+--threads "$THREADS"} --output "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  echo "$(date +%T) $name done"
}
bench "$NAME-held_out" benchmarks/prompts/held_out.jsonl
bench "$NAME-other_kinds" benchmarks/prompts/other_kinds.jsonl ${OTHER_SELECT:---per-category 6}
