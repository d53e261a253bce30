#!/usr/bin/env bash
# Every method the project offers on the default model (its best configurations so far), in one bench run per
# prompt set (each method right after the same plain run of each prompt). Run on a quiet machine; about 60 min
# here. Reports in benchmarks/results/. MT-Bench: the first 2 questions of each of its 8 categories (its file
# is sorted by category, so the first 10 questions would all be `writing`); MT_SELECT="--limit 10" gives
# the writing-only selection of earlier runs.
# CONFIGS and NAME (environment) run another list under another report name (bench_mtp_trees_dflash.sh);
# SETS and OTHER_SELECT pick the prompt sets (the README's methods table: scripts/bench_methods_table.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
mkdir -p "$OUT"
MT=../shared/data/eval/mt_bench/question.jsonl
OTHER=benchmarks/prompts/other_kinds.jsonl
DEFAULT_CONFIGS='[
 {"method": "ngram", "num_speculative_tokens": 5},
 {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 8, "confidence_threshold": 0.45},
 {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 6, "tree_top_k": 3, "tree_num_draft_tokens": 8, "confidence_threshold": 0.3},
 {"method": "hybrid", "prompt_lookup_min": 3, "fallback": {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 6, "confidence_threshold": 0.6}},
 {"method": "medusa", "model": "gemma-3-270m-medusa", "tree_top_k": null, "tree_num_draft_tokens": 16},
 {"method": "medusa", "model": "gemma-3-270m-medusa", "tree_top_k": 6, "tree_num_draft_tokens": 16},
 {"method": "medusa", "model": "gemma-3-270m-medusa", "tree_top_k": 6, "tree_num_draft_tokens": 24},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "confidence_threshold": 0.4},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "tree_top_k": 3, "tree_num_draft_tokens": 8, "confidence_threshold": 0.2},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b16", "num_speculative_tokens": 15},
 {"method": "draft_model", "model": "self:14", "num_speculative_tokens": 3}
]'
CONFIGS=${CONFIGS:-$DEFAULT_CONFIGS}
NAME=${NAME:-all-methods-2}
bench() {  # name prompts [extra args...]
  local name=$1 prompts=$2; shift 2
  .venv/bin/specdec bench --prompts "$prompts" --speculative-config "$CONFIGS" --no-progress \
    --output "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  echo "$(date +%T) $name done"
}
SETS=${SETS:-mt other}  # SETS=other: other_kinds only; OTHER_SELECT="--per-category 3": 12 of its 48 prompts
if [[ " $SETS " == *" mt "* ]]; then bench "$NAME-mt_bench" "$MT" ${MT_SELECT:---per-category 2}; fi
if [[ " $SETS " == *" other "* ]]; then bench "$NAME-other_kinds" "$OTHER" ${OTHER_SELECT:-}; fi
