# Sourced by the server check scripts: start_server PORT ARGS... starts `specdec serve` on 127.0.0.1:PORT in
# the background (log in $OUT/server.log), waits for /health, and stops it when the calling script exits.
PY=${PY:-.venv/bin/python}

start_server() {
  local port=$1; shift
  "$PY" -m specdec.cli serve --host 127.0.0.1 --port "$port" --log-level warning "$@" > "$OUT/server.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null; wait $SERVER_PID 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" > /dev/null; then return 0; fi
    if ! kill -0 $SERVER_PID 2>/dev/null; then echo "server exited:"; tail -20 "$OUT/server.log"; exit 1; fi
    sleep 0.5
  done
  echo "server did not come up"; exit 1
}
