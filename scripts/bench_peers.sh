#!/usr/bin/env bash
# The peer table (README "Compared with vLLM, llama.cpp and transformers"): batch 1, greedy, 128 new tokens,
# the first 12 prompts of benchmarks/prompts/other_kinds.jsonl, one run of this script on a quiet machine:
#   1. specdec bf16: plain and n-gram "auto", with transformers' greedy and prompt lookup on the same prompts
#   2. specdec --quantization gguf (the GGUF file's Q4_K_M blocks): plain and n-gram "auto", with llama.cpp
#      (llama-cpp-python, installed separately) greedy and prompt lookup on the same GGUF file
#   3. vLLM's CPU build (VLLM_PY, its own venv), bf16, one request at a time: plain and n-gram
# then benchmarks/peers/peer_table.py. vLLM's outputs are checked against the batch-1 plain token ids of
# benchmarks/results/batching/other_kinds.json (scripts/bench_batching.sh other: the same prompts).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/peers
OTHER=benchmarks/prompts/other_kinds.jsonl
N=${N:-12}
AUTO='{"method": "ngram", "num_speculative_tokens": "auto"}'
VLLM_PY=${VLLM_PY:-/work/vllm-venv/bin/python}
mkdir -p "$OUT"
.venv/bin/specdec bench --prompts "$OTHER" --limit "$N" --speculative-config "$AUTO" --include-transformers \
  --output "$OUT/peers-bf16.json" --no-progress | tee "$OUT/peers-bf16.txt"
.venv/bin/specdec bench --prompts "$OTHER" --limit "$N" --speculative-config "$AUTO" --quantization gguf \
  --include-llama-cpp --output "$OUT/peers-gguf.json" --no-progress | tee "$OUT/peers-gguf.txt"
MODEL_DIR=$(ls -d ~/.cache/specdec/gguf/gemma-3-270m-*-bfloat16/ | head -1)  # the bf16 folder specdec converted
VLLM_CPU_KVCACHE_SPACE=2 "$VLLM_PY" benchmarks/peers/vllm_cpu_batched.py --model "$MODEL_DIR" --prompts "$OTHER" \
  --limit "$N" --max-tokens 128 --modes plain,ngram --threads 2 --output "$OUT/vllm-b1.json"
.venv/bin/python benchmarks/peers/peer_table.py --bf16 "$OUT/peers-bf16.json" --gguf "$OUT/peers-gguf.json" \
  --vllm "$OUT/vllm-b1.json" --reference benchmarks/results/batching/other_kinds.json --output "$OUT/peers.md"
