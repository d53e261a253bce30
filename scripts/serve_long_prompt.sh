#!/usr/bin/env bash
# A 30k-token prompt against `specdec serve` on the default model while a short stream runs: served within
# the memory bound or refused with a 400, and the stream's inter-token gap before vs during.
#   scripts/serve_long_prompt.sh [PROMPT_TOKENS (default 30000)] [OUT (default out/long_prompt)]
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENS=${1:-30000}
OUT=${2:-out/long_prompt}
PORT=${PORT:-8793}
mkdir -p "$OUT"
source scripts/serve_in_background.sh
start_server "$PORT" --threads 2
.venv/bin/python scripts/serve_long_prompt.py --base-url "http://127.0.0.1:$PORT" --server-pid "$SERVER_PID" \
  --prompt-tokens "$TOKENS" --streams 1 --output "$OUT/report.json"
