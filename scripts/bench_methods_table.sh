#!/usr/bin/env bash
# The README's methods table and the defaults check, in one bench run: every method's shipped default (a bare
# config: the drafter's stored best settings), n-gram, the draft model and the demo's hybrid, then the other
# configurations each learned drafter was tuned among (scripts/tune_drafter_defaults.sh), so that every bare
# config can be held against the best configuration of the same run. The hybrid gives no lookup length: its
# default (7) is the demo's. 12 prompts of benchmarks/prompts/other_kinds.jsonl (3 per category), batch 1,
# 128 new tokens, each config right after the same plain run; about 20 minutes on the 2-core AVX2 EPYC.
# Report: benchmarks/results/methods-table-other_kinds.{json,txt};
# scripts/check_defaults.py reads it.
set -euo pipefail
cd "$(dirname "$0")/.."
export NAME=methods-table SETS=other OTHER_SELECT="--per-category 3"
E='"method": "eagle3", "model": "gemma-3-270m-eagle3"'
M='"method": "medusa", "model": "gemma-3-270m-medusa"'
T='"method": "mtp", "model": "gemma-3-270m-mtp"'
D8='"method": "dflash", "model": "gemma-3-270m-dflash-b8"'
D16='"method": "dflash", "model": "gemma-3-270m-dflash-b16"'
export CONFIGS="[
 {\"method\": \"ngram\", \"num_speculative_tokens\": 5},
 {\"method\": \"ngram\", \"num_speculative_tokens\": 7},
 {\"method\": \"ngram\", \"num_speculative_tokens\": \"auto\"},
 {\"method\": \"draft_model\", \"model\": \"self:14\", \"num_speculative_tokens\": 3},
 {$M},
 {$E},
 {$T},
 {$D8},
 {$D16},
 {\"method\": \"hybrid\", \"prompt_lookup_min\": 3, \"fallback\": {$E, \"num_speculative_tokens\": 6, \"confidence_threshold\": 0.6}},
 {$E, \"num_speculative_tokens\": 6, \"tree_top_k\": 3, \"tree_num_draft_tokens\": 8, \"confidence_threshold\": 0.3},
 {$E, \"num_speculative_tokens\": \"auto\"},
 {$M, \"tree_top_k\": null, \"tree_num_draft_tokens\": 8},
 {$M, \"tree_top_k\": null, \"tree_num_draft_tokens\": 16},
 {$M, \"tree_top_k\": 6, \"tree_num_draft_tokens\": 16},
 {$T, \"num_speculative_tokens\": 6, \"tree_top_k\": 3, \"tree_num_draft_tokens\": 8, \"confidence_threshold\": 0.2},
 {$D8, \"num_speculative_tokens\": 7, \"confidence_threshold\": 0},
 {$D16, \"num_speculative_tokens\": 7, \"confidence_threshold\": 0},
 {$D16, \"num_speculative_tokens\": 15, \"confidence_threshold\": 0}
]"
scripts/bench_all_methods.sh
.venv/bin/python scripts/check_defaults.py benchmarks/results/methods-table-other_kinds.json
