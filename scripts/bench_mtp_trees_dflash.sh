#!/usr/bin/env bash
# MTP chains against MTP dynamic trees, and the DFlash B=8 drafter (chain, threshold, tree) beside the EAGLE-3
# chain it is compared with, in one bench run per prompt set (each method right after the same plain run of
# each prompt). Run on a quiet machine. Reports: benchmarks/results/mtp-trees-dflash-*.
set -euo pipefail
export CONFIGS='[
 {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 8, "confidence_threshold": 0.45},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "confidence_threshold": 0.4},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "tree_top_k": 3, "tree_num_draft_tokens": 10},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "tree_top_k": 3, "tree_num_draft_tokens": 8, "confidence_threshold": 0.2},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 5, "tree_top_k": 2, "tree_num_draft_tokens": 6, "confidence_threshold": 0.2},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7, "confidence_threshold": 0.3},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7, "tree_top_k": 3, "tree_num_draft_tokens": 10}
]'
MT_SELECT=${MT_SELECT:---limit 10} NAME=mtp-trees-dflash exec bash "$(dirname "$0")/bench_all_methods.sh"
