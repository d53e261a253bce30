#!/usr/bin/env bash
# Plain and speculative decoding on each quantized target of the default model (dense bf16, int8, w8a8_int8, int4, the
# GGUF's own Q4_K_M tensors), every shipped drafter, in one process per prompt set; then perplexity and top-1
# agreement on held-out text (QUALITY=0 skips it). Run on a quiet machine: about 40 min for other_kinds here. Reports in
# benchmarks/results/quantized/. PROMPTS, SELECT and NAME (environment) run another prompt set; TARGETS, CONFIGS
# and QUALITY_TARGETS replace the targets, the configs and the quality run's targets.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/quantized
mkdir -p "$OUT"
PROMPTS=${PROMPTS:-benchmarks/prompts/other_kinds.jsonl}
NAME=${NAME:-other_kinds}
# every shipped drafter as a user gets it: bare configs (the drafter's stored defaults), n-gram "auto" and the
# demo's hybrid
CONFIGS=${CONFIGS:-'[
 {"method": "ngram", "num_speculative_tokens": "auto"},
 {"method": "hybrid", "prompt_lookup_min": 3, "fallback": {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 6, "confidence_threshold": 0.6}},
 {"method": "eagle3", "model": "gemma-3-270m-eagle3"},
 {"method": "medusa", "model": "gemma-3-270m-medusa"},
 {"method": "mtp", "model": "gemma-3-270m-mtp"},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8"}
]'}
.venv/bin/specdec bench --prompts "$PROMPTS" ${SELECT:---per-category 3} --threads 2 --quantization "${TARGETS:-none,int8,w8a8_int8,int4,gguf}" \
  --speculative-config "$CONFIGS" --no-progress --output "$OUT/$NAME.json" > "$OUT/$NAME.txt" 2>&1
echo "$(date +%T) bench $NAME done"
if [ "${QUALITY:-1}" = 1 ]; then
  .venv/bin/specdec quality --quantization "${QUALITY_TARGETS:-int8,w8a8_int8,int4,gguf}" --threads 2 --articles 8 --max-tokens 1024 \
    --output "$OUT/quality.json" > "$OUT/quality.txt" 2>&1
  echo "$(date +%T) quality done"
fi
