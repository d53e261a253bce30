#!/usr/bin/env bash
# The README's methods table: every method's shipped default (a bare config: the drafter's stored best
# settings) and the demo's hybrid, each right after the same plain run, on 12 prompts of
# benchmarks/prompts/other_kinds.jsonl (3 per category), batch 1, 128 new tokens; about 8 minutes here.
set -euo pipefail
cd "$(dirname "$0")/.."
export NAME=methods-table SETS=other OTHER_SELECT="--per-category 3"
export CONFIGS='[
 {"method": "ngram", "num_speculative_tokens": 5},
 {"method": "ngram", "num_speculative_tokens": "auto"},
 {"method": "draft_model", "model": "self:14", "num_speculative_tokens": 3},
 {"method": "medusa", "model": "gemma-3-270m-medusa"},
 {"method": "eagle3", "model": "gemma-3-270m-eagle3"},
 {"method": "mtp", "model": "gemma-3-270m-mtp"},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8"},
 {"method": "hybrid", "prompt_lookup_min": 3, "fallback": {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 6, "confidence_threshold": 0.6}}
]'
exec scripts/bench_all_methods.sh
