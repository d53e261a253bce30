#!/usr/bin/env bash
# Batched decoding on the default model (bf16, greedy, 128 new tokens), each part after the other on a quiet
# machine; reports under benchmarks/results/batching/. Parts (all by default, or name some):
#   cost   scripts/step_cost_table.py: ms per forward against sequences and draft length
#   other  specdec bench --batch-size 1,4,16,32 on 32 prompts of benchmarks/prompts/other_kinds.jsonl:
#          plain, n-gram "auto", EAGLE-3 "auto" (PNG next to the JSON)
#   mt     the same on MT-Bench's first 32 first turns
#   vllm   vLLM's CPU build (VLLM_PY, its own venv) on the same 32 other_kinds prompts, all batched: plain and
#          n-gram; then benchmarks/peers/compare_with_vllm.py against `other` (every output checked against
#          specdec's batch-1 plain)
#   vllm20 the issue's comparison: 20 other_kinds prompts all batched (B=20), specdec (plain, n-gram "auto",
#          EAGLE-3 "auto") then vLLM (plain, n-gram), and the comparison against specdec's batch-1 plain
#   serve  `specdec serve` with n-gram "auto" and --max-prompt-tokens 16384: MT-Bench requests, 16 at
#          concurrency 1 and 64 at concurrency 32; then, while 4 streams run (scripts/serve_long_prompt.py), a 30k-token prompt
#          (refused: 400 naming the limit) and a 4k-token one (served: the streams' gaps, peak memory)
#   data   `specdec data generate` of 32 prompts at --batch-size 1 and 16: tok/s and identical samples
#   every  every method (the committed drafters, chains and trees) at B=32 on 32 other_kinds prompts,
#          32 new tokens: identical fraction against batch-1 plain
#   auto1  the "auto" policy against fixed draft lengths at B=1 (16 other_kinds prompts): n-gram auto vs
#          k = 3, 5, 8, 10 and EAGLE-3 auto vs k = 4, 6, 8
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/batching
MT=../shared/data/eval/mt_bench/question.jsonl
OTHER=benchmarks/prompts/other_kinds.jsonl
AUTO='{"method": "ngram", "num_speculative_tokens": "auto"}'
EAGLE3_AUTO='{"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": "auto", "max_num_speculative_tokens": 8, "confidence_threshold": 0.45}'
CONFIGS="[$AUTO, $EAGLE3_AUTO]"
VLLM_PY=${VLLM_PY:-/work/vllm-venv/bin/python}
PORT=${PORT:-8765}
URL="http://127.0.0.1:$PORT"
EVERY='[
 {"method": "ngram", "num_speculative_tokens": 5},
 {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 8, "confidence_threshold": 0.45},
 {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 6, "tree_top_k": 3, "tree_num_draft_tokens": 8, "confidence_threshold": 0.3},
 {"method": "hybrid", "prompt_lookup_min": 3, "fallback": {"method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 6, "confidence_threshold": 0.6}},
 {"method": "medusa", "model": "gemma-3-270m-medusa", "tree_top_k": 6, "tree_num_draft_tokens": 16},
 {"method": "mtp", "model": "gemma-3-270m-mtp", "num_speculative_tokens": 6, "tree_top_k": 3, "tree_num_draft_tokens": 8, "confidence_threshold": 0.2},
 {"method": "dflash", "model": "gemma-3-270m-dflash-b8", "num_speculative_tokens": 7},
 {"method": "draft_model", "model": "self:14", "num_speculative_tokens": 3}
]'
PARTS=${*:-cost other mt vllm vllm20 serve data every auto1}
mkdir -p "$OUT"
has() { [[ " $PARTS " == *" $1 "* ]]; }

if has cost; then
  .venv/bin/python scripts/step_cost_table.py --output "$OUT/step-cost.json" | tee "$OUT/step-cost.txt"
fi
if has other; then
  .venv/bin/specdec bench --prompts "$OTHER" --limit 32 --batch-size 1,4,16,32 --speculative-config "$CONFIGS" \
    --output "$OUT/other_kinds.json" --no-progress | tee "$OUT/other_kinds.txt"
fi
if has mt; then
  .venv/bin/specdec bench --prompts "$MT" --limit 32 --batch-size 1,4,16,32 --speculative-config "$CONFIGS" \
    --output "$OUT/mt_bench.json" --no-progress | tee "$OUT/mt_bench.txt"
fi
if has vllm; then
  MODEL=$(ls -d ~/.cache/specdec/gguf/gemma-3-270m-*-bfloat16/ | head -1)
  VLLM_CPU_KVCACHE_SPACE=2 "$VLLM_PY" benchmarks/peers/vllm_cpu_batched.py --model "$MODEL" --prompts "$OTHER" \
    --limit 32 --max-tokens 128 --modes plain-batched,ngram-batched --threads 2 --output "$OUT/vllm-other_kinds.json"
  .venv/bin/python benchmarks/peers/compare_with_vllm.py --specdec "$OUT/other_kinds.json" \
    --vllm "$OUT/vllm-other_kinds.json" --batch-size 32 --output "$OUT/vllm-comparison.txt"
fi
if has vllm20; then
  MODEL=$(ls -d ~/.cache/specdec/gguf/gemma-3-270m-*-bfloat16/ | head -1)
  .venv/bin/specdec bench --prompts "$OTHER" --limit 20 --batch-size 20 --speculative-config "$CONFIGS" \
    --output "$OUT/other_kinds-20.json" --no-progress | tee "$OUT/other_kinds-20.txt"
  VLLM_CPU_KVCACHE_SPACE=2 "$VLLM_PY" benchmarks/peers/vllm_cpu_batched.py --model "$MODEL" --prompts "$OTHER" \
    --limit 20 --max-tokens 128 --modes plain-batched,ngram-batched --threads 2 --output "$OUT/vllm-other_kinds-20.json"
  .venv/bin/python benchmarks/peers/compare_with_vllm.py --specdec "$OUT/other_kinds-20.json" \
    --vllm "$OUT/vllm-other_kinds-20.json" --batch-size 20 --output "$OUT/vllm-comparison-20.txt"
fi
if has serve; then
  .venv/bin/specdec serve --speculative-config "$AUTO" --max-num-seqs 32 --max-prompt-tokens 16384 --port "$PORT" \
    --log-level warning \
    > "$OUT/serve.server.log" 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
  for _ in $(seq 600); do curl -sf "$URL/health" > /dev/null && break; sleep 1; done
  for c in 1 32; do  # 16 requests one at a time give its rate; 64 at 32 in flight
    .venv/bin/specdec bench serve --base-url "$URL" --prompts "$MT" --num-prompts $((c == 1 ? 16 : 64)) \
      --max-concurrency $c --max-tokens 128 --output-json "$OUT/serve-load-c$c.json" --output-table "$OUT/serve-load-c$c.txt"
  done
  for n in 30000 4000; do
    .venv/bin/python scripts/serve_long_prompt.py --base-url "$URL" --server-pid "$SERVER" --prompt-tokens $n \
      --streams 4 --output "$OUT/serve-prompt-$n.json"
  done
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; trap - EXIT
fi
if has data; then
  rm -rf "$OUT/data-b1" "$OUT/data-b16"
  for b in 1 16; do
    /usr/bin/time -f "%e" -o "$OUT/data-b$b.seconds" .venv/bin/specdec data generate --output "$OUT/data-b$b" \
      --num-prompts "${DATA_PROMPTS:-96}" --max-new-tokens 128 --batch-size "$b" 2>&1 | tee "${TMPDIR:-/tmp}/specdec-data-b$b.log" | tail -2
  done
  .venv/bin/python - "$OUT" "${TMPDIR:-/tmp}" <<'PY' | tee "$OUT/data-generate.txt"
import sys
from pathlib import Path
from specdec.training.self_distill import read_samples
out, tmp = Path(sys.argv[1]), sys.argv[2]
import re
runs = {b: {s.id: s.response_ids for s in read_samples(out / f"data-b{b}")} for b in (1, 16)}
secs = {b: float((out / f"data-b{b}.seconds").read_text()) for b in (1, 16)}
tps = {b: sum(map(len, runs[b].values())) / secs[b] for b in (1, 16)}
gen = {b: float(re.findall(r"([0-9.]+) tok/s \(batch size", Path(f"{tmp}/specdec-data-b{b}.log").read_text())[-1]) for b in (1, 16)}
same = sum(runs[16].get(k) == v for k, v in runs[1].items())
print(f"{len(runs[1])} prompts. Generation (model loading not counted): batch 1 {gen[1]:.1f} tok/s, batch 16 "
      f"{gen[16]:.1f} tok/s: {gen[16] / gen[1]:.2f}x. Whole process: {tps[1]:.1f} ({secs[1]:.0f} s) and "
      f"{tps[16]:.1f} tok/s ({secs[16]:.0f} s): {tps[16] / tps[1]:.2f}x. Identical samples {same}/{len(runs[1])}")
PY
  rm -rf "$OUT/data-b1" "$OUT/data-b16"
fi
if has every; then
  .venv/bin/specdec bench --prompts "$OTHER" --limit 32 --max-new-tokens 32 --batch-size 32 \
    --speculative-config "$EVERY" --output "$OUT/every-method.json" --no-progress | tee "$OUT/every-method.txt"
fi
if has auto1; then
  E3='"method": "eagle3", "model": "gemma-3-270m-eagle3", "confidence_threshold": 0.45'
  FIXED="[$AUTO, $EAGLE3_AUTO"
  for k in 3 5 8 10; do FIXED="$FIXED, {\"method\": \"ngram\", \"num_speculative_tokens\": $k}"; done
  for k in 4 6 8; do FIXED="$FIXED, {$E3, \"num_speculative_tokens\": $k}"; done
  .venv/bin/specdec bench --prompts "$OTHER" --limit 16 --batch-size 1 --speculative-config "$FIXED]" \
    --output "$OUT/auto-vs-fixed-b1.json" --no-progress | tee "$OUT/auto-vs-fixed-b1.txt"
fi
