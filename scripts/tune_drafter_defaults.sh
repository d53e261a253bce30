#!/usr/bin/env bash
# The sweeps behind the shipped drafters' stored best settings (their config.json `proposal_methods`), then the
# check that a bare {"method": ..., "model": ...} config is within 5% of the best configuration measured on
# benchmarks/prompts/other_kinds.jsonl. Run on a quiet machine; reports in benchmarks/results/defaults/.
#   tune   MT-Bench (never the held-out kinds), B=1, greedy, 128 tokens: Medusa's small trees and DFlash's
#          draft lengths and thresholds (the settings no earlier run had measured on all 8 categories)
#   auto   MT-Bench: each stored shape with "num_speculative_tokens": "auto" against its fixed length
#   eagle3 MT-Bench, 2 questions per category: EAGLE-3's stored chain beside dynamic trees, for its
#          specdec_tuning after a retrain or a kernel change (not part of the default PARTS)
#   amx    MT-Bench on a CPU whose bf16 kernels are the AMX build: Medusa's, MTP's and DFlash's stored "auto" beside
#          their fixed shapes, for `specdec_default_proposal_method_by_kernels` (not part of the default PARTS;
#          runs defaults/auto-xeon and, for DFlash's current weights, defaults/$DFLASH_RUN: dflash-long5)
#   check  the bare configs (the stored settings) beside fixed lengths on the other kinds (scripts/check_defaults.py)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/defaults
MT=../shared/data/eval/mt_bench/question.jsonl
OTHER=benchmarks/prompts/other_kinds.jsonl
PARTS=${*:-tune auto check}
mkdir -p "$OUT"
has() { [[ " $PARTS " == *" $1 "* ]]; }
M='"method": "medusa", "model": "gemma-3-270m-medusa"'
D8='"method": "dflash", "model": "gemma-3-270m-dflash-b8"'
D16='"method": "dflash", "model": "gemma-3-270m-dflash-b16"'
TUNE="[
 {$M, \"tree_top_k\": null, \"tree_num_draft_tokens\": 4},
 {$M, \"tree_top_k\": null, \"tree_num_draft_tokens\": 8},
 {$M, \"tree_top_k\": null, \"tree_num_draft_tokens\": 16},
 {$M, \"tree_top_k\": 4, \"tree_num_draft_tokens\": 8},
 {$M, \"tree_top_k\": 6, \"tree_num_draft_tokens\": 16},
 {$D8, \"num_speculative_tokens\": 3, \"confidence_threshold\": 0},
 {$D8, \"num_speculative_tokens\": 5, \"confidence_threshold\": 0},
 {$D8, \"num_speculative_tokens\": 7, \"confidence_threshold\": 0},
 {$D8, \"num_speculative_tokens\": 7, \"confidence_threshold\": 0.3},
 {$D16, \"num_speculative_tokens\": 3, \"confidence_threshold\": 0},
 {$D16, \"num_speculative_tokens\": 5, \"confidence_threshold\": 0},
 {$D16, \"num_speculative_tokens\": 7, \"confidence_threshold\": 0},
 {$D16, \"num_speculative_tokens\": 7, \"confidence_threshold\": 0.3},
 {$D16, \"num_speculative_tokens\": 15, \"confidence_threshold\": 0}
]"
T='"method": "mtp", "model": "gemma-3-270m-mtp"'
# the bare configs (Medusa, MTP and DFlash store "auto" with their tuned shape) beside fixed lengths
CHECK="[
 {$M}, {$M, \"num_speculative_tokens\": 4}, {$M, \"tree_top_k\": null, \"tree_num_draft_tokens\": 8, \"num_speculative_tokens\": 4},
 {$T}, {$T, \"num_speculative_tokens\": 6}, {$T, \"num_speculative_tokens\": 6, \"tree_top_k\": 3, \"tree_num_draft_tokens\": 8, \"confidence_threshold\": 0.2},
 {$D8}, {$D8, \"num_speculative_tokens\": 7},
 {$D16}, {$D16, \"num_speculative_tokens\": 5}
]"
AUTO="[
 {$M, \"num_speculative_tokens\": 4}, {$M, \"num_speculative_tokens\": \"auto\"},
 {$D8, \"num_speculative_tokens\": 7}, {$D8, \"num_speculative_tokens\": \"auto\"},
 {$D16, \"num_speculative_tokens\": 5}, {$D16, \"num_speculative_tokens\": \"auto\"},
 {$T, \"num_speculative_tokens\": 6}, {$T, \"num_speculative_tokens\": \"auto\"}
]"
if has tune; then
  .venv/bin/specdec bench --prompts "$MT" --per-category 1 --speculative-config "$TUNE" --no-progress \
    --output "$OUT/tune-mt_bench.json" | tee "$OUT/tune-mt_bench.txt"
fi
if has auto; then
  .venv/bin/specdec bench --prompts "$MT" --per-category 1 --speculative-config "$AUTO" --no-progress \
    --output "$OUT/auto-mt_bench.json" | tee "$OUT/auto-mt_bench.txt"
fi
E='"method": "eagle3", "model": "gemma-3-270m-eagle3"'
# trees of 15 nodes: with the root, 16 verification rows, one tile of rows in the AMX head's int8 screen
EAGLE3="[
 {$E, \"num_speculative_tokens\": 7, \"confidence_threshold\": 0.45},
 {$E, \"num_speculative_tokens\": 6, \"tree_top_k\": 3, \"tree_num_draft_tokens\": 8, \"confidence_threshold\": 0.3},
 {$E, \"num_speculative_tokens\": 7, \"tree_top_k\": 3, \"tree_num_draft_tokens\": 12, \"confidence_threshold\": 0.2},
 {$E, \"num_speculative_tokens\": 8, \"tree_top_k\": 4, \"tree_num_draft_tokens\": 15, \"confidence_threshold\": 0.1},
 {$E, \"num_speculative_tokens\": 10, \"tree_top_k\": 3, \"tree_num_draft_tokens\": 15, \"confidence_threshold\": 0.1}
]"
if has eagle3; then
  .venv/bin/specdec bench --prompts "$MT" --per-category 2 --speculative-config "$EAGLE3" --no-progress \
    --output "$OUT/eagle3-mt_bench.json" | tee "$OUT/eagle3-mt_bench.txt"
fi
# where verification rows cost about one (AMX): "auto" against fixed shapes; pass the shapes explicitly, since a
# bare config there already takes the AMX default
AMX="[
 {$M, \"num_speculative_tokens\": \"auto\"}, {$M, \"num_speculative_tokens\": 4}, {$M, \"num_speculative_tokens\": 4, \"tree_num_draft_tokens\": 15},
 {$T, \"num_speculative_tokens\": \"auto\"}, {$T, \"num_speculative_tokens\": 6}, {$T, \"tree_top_k\": 3},
 {$D16, \"num_speculative_tokens\": \"auto\"}, {$D16, \"num_speculative_tokens\": 5}
]"
AMX_DFLASH="[
 {$D8, \"num_speculative_tokens\": \"auto\"}, {$D8, \"num_speculative_tokens\": 7}, {$D8, \"num_speculative_tokens\": 5},
 {$D8, \"num_speculative_tokens\": 7, \"confidence_threshold\": 0}
]"
if has amx; then
  .venv/bin/specdec bench --prompts "$MT" --per-category 1 --speculative-config "$AMX" --no-progress \
    --output "$OUT/auto-xeon-mt_bench.json" | tee "$OUT/auto-xeon-mt_bench.txt"
  .venv/bin/specdec bench --prompts "$MT" --per-category 1 --speculative-config "$AMX_DFLASH" --no-progress \
    --output "$OUT/${DFLASH_RUN:-dflash-long5}-mt_bench.json" | tee "$OUT/${DFLASH_RUN:-dflash-long5}-mt_bench.txt"
fi
if has check; then
  .venv/bin/specdec bench --prompts "$OTHER" --per-category 3 --speculative-config "$CHECK" --no-progress \
    --output "$OUT/check-other_kinds.json" | tee "$OUT/check-other_kinds.txt"
  .venv/bin/python scripts/check_defaults.py "$OUT/check-other_kinds.json"
fi
