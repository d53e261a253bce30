#!/usr/bin/env bash
# The soak test: `specdec serve` on the default model, then `specdec bench soak` (1,000 mixed requests at
# concurrency 16: streamed and not, vanishing clients, bad inputs), reporting failures and the server's RSS.
#   scripts/soak_server.sh [REQUESTS (default 1000)] [OUT (default out/soak)]
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${1:-1000}
OUT=${2:-out/soak}
PORT=${PORT:-8792}
mkdir -p "$OUT"
source scripts/serve_in_background.sh
start_server "$PORT" --speculative-config '{"method": "ngram", "num_speculative_tokens": "auto"}' --threads 2 \
  --max-tokens-limit 64
.venv/bin/specdec bench soak --base-url "http://127.0.0.1:$PORT" --requests "$REQUESTS" --concurrency 16 \
  --max-tokens 32 --output-json "$OUT/soak.json"
