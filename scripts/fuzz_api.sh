#!/usr/bin/env bash
# Property fuzzing of a real `specdec serve` (default model) with schemathesis, from the server's own OpenAPI
# schema: every generated request must get a non-5xx answer, and the server must be healthy afterwards.
#   scripts/fuzz_api.sh [EXAMPLES_PER_OPERATION (default 200)] [OUT (default out/fuzz)]
# 7 operations x 200 examples, plus schemathesis' coverage phase: well over 1,000 requests.
set -euo pipefail
cd "$(dirname "$0")/.."
EXAMPLES=${1:-200}
OUT=${2:-out/fuzz}
PORT=${PORT:-8791}
mkdir -p "$OUT"
source scripts/serve_in_background.sh
# small max_tokens keep the valid generations short; a fuzzer's larger values get a 400
start_server "$PORT" --max-tokens-limit 8 --max-num-seqs 8 --max-waiting 512 --threads 2
status=0
.venv/bin/schemathesis run "http://127.0.0.1:$PORT/openapi.json" --checks not_a_server_error \
  --max-examples "$EXAMPLES" --seed 1 --workers 4 --request-timeout 120 --no-color --report junit --report-dir "$OUT" \
  2>&1 | tee "$OUT/schemathesis.txt" || status=$?
health=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")
echo "health after fuzzing: $health"
# schemathesis exits 1 for its own errors too (its coverage phase once failed inside hypothesis): the verdict
# comes from the JUnit report; a request that timed out or lost its connection counts against the server
.venv/bin/python scripts/fuzz_verdict.py "$OUT" --exit-status "$status" || status=$?
test "$health" = 200 && exit "$status"
