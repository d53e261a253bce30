#!/usr/bin/env bash
# The server with n-gram drafting against a plain one, on the default model (--threads 1):
#   ngram: `specdec serve` with n-gram drafting, then
#     1. `specdec bench serve`: 64 requests at concurrency 8 (MT-Bench first turns, 64 new tokens, greedy);
#     2. scripts/check_serve_vs_generate.py: greedy server outputs == `specdec generate`, /metrics == responses;
#   plain: the same load against a server without a speculative config (the wall-clock gain under serving).
# Reports: benchmarks/results/serve-load-{ngram,plain}.{json,txt}, serve-vs-generate-ngram.{json,txt}.
# `scripts/bench_serve_ngram_vs_plain.sh ngram` or `... plain` runs one part.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
MT=../shared/data/eval/mt_bench/question.jsonl
NGRAM='{"method": "ngram", "num_speculative_tokens": 5}'
PORT=${PORT:-8765}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"

start_server() {  # name [speculative config]
  .venv/bin/specdec serve ${2:+--speculative-config "$2"} --threads 1 --port "$PORT" --log-level warning \
    > "$OUT/serve-$1.server.log" 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
  for _ in $(seq 300); do curl -sf "$URL/health" > /dev/null && return; sleep 1; done
  echo "server did not start" >&2; exit 1
}
stop_server() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; trap - EXIT; }
load() {  # name
  .venv/bin/specdec bench serve --base-url "$URL" --prompts "$MT" --num-prompts 64 --max-concurrency 8 \
    --max-tokens 64 --output-json "$OUT/serve-load-$1.json" --output-table "$OUT/serve-load-$1.txt"
  curl -s "$URL/metrics" | grep -v '^#' | grep -v '_bucket' > "$OUT/serve-$1.metrics.txt"
}

if [ "${1:-all}" != plain ]; then
  start_server ngram "$NGRAM"
  load ngram
  .venv/bin/python scripts/check_serve_vs_generate.py --base-url "$URL" --speculative-config "$NGRAM" \
    --prompts "$MT" --limit 6 --max-tokens 64 --output "$OUT/serve-vs-generate-ngram.json" \
    | tee "$OUT/serve-vs-generate-ngram.txt"
  stop_server
fi
if [ "${1:-all}" != ngram ]; then
  start_server plain
  load plain
  stop_server
fi
