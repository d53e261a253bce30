#!/usr/bin/env python3
"""Sends every bad input of tests/test_serve.py (plus bad routes, a 5 MB body and a full queue) to a real
`specdec serve` on a tiny random model, and prints what came back as a markdown table.

    python scripts/probe_bad_inputs.py [--output out/bad-inputs.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import httpx  # noqa: E402

from serve_helpers import ServerProcess  # noqa: E402
from test_serve import BAD_INPUTS, MAX_MODEL_LEN, NGRAM  # noqa: E402
from tiny_models import make_tiny_model  # noqa: E402


def _show(body: object, limit: int = 110) -> str:
    text = body.decode("utf-8", "backslashreplace") if isinstance(body, bytes) else json.dumps(body)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.replace("|", "\\|")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--output", default=None)
    args = p.parse_args()
    folder = make_tiny_model(Path(tempfile.mkdtemp()) / "bigram", family="llama", num_layers=2, seed=3, bigram=True)
    server = ServerProcess("--model", folder, "--device", "cpu", "--threads", "1", "--speculative-config",
                           json.dumps(NGRAM), "--served-model-name", "tiny", "--max-model-len", str(MAX_MODEL_LEN),
                           "--max-tokens-limit", "512", "--max-num-seqs", "1", "--max-waiting", "1").start()
    rows = ["| # | case | request | status | error body (message; param; code) |", "|---|---|---|---|---|"]
    try:
        base = server.base_url
        cases = [(name, "POST", path, body) for name, path, body, _, _ in BAD_INPUTS]
        cases += [("unknown-route", "GET", "/v1/nothing", None), ("wrong-method", "GET", "/v1/completions", None),
                  ("unknown-model-card", "GET", "/v1/models/other", None),
                  ("body-5MB", "POST", "/v1/completions", b"x" * (5 * 1024 * 1024))]
        for i, (name, method, path, body) in enumerate(cases, 1):
            kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
                else ({"json": body} if body is not None else {})
            r = httpx.request(method, base + path, timeout=60, **kwargs)
            e = r.json()["error"]
            shown = "(5 MB of x)" if name == "body-5MB" else _show(body) if body is not None else ""
            rows.append(f"| {i} | {name} | `{method} {path}` {shown} | {r.status_code} | "
                        f"{_show(e['message'], 200)}; {e['param']}; {e['code']} |")
        # a full queue: one running, one waiting, the third is refused
        long = {"model": "tiny", "prompt": "hello", "max_tokens": 512, "ignore_eos": True, "stream": True}
        opened = []
        for _ in range(2):
            client = httpx.Client(timeout=60)
            cm = client.stream("POST", base + "/v1/completions", json=long)
            opened.append((client, cm, cm.__enter__()))
        r = httpx.post(base + "/v1/completions", json={**long, "stream": False}, timeout=60)
        e = r.json()["error"]
        rows.append(f"| {len(cases) + 1} | queue-full | `POST /v1/completions` 3rd long request with 1 running + 1 "
                    f"queued allowed | {r.status_code} (Retry-After: {r.headers.get('retry-after')}) | "
                    f"{_show(e['message'], 200)}; {e['param']}; {e['code']} |")
        for client, cm, _ in opened:
            cm.__exit__(None, None, None)
            client.close()
        alive = httpx.get(base + "/health", timeout=10).json()
    finally:
        server.stop()
    table = "\n".join(rows)
    print(table)
    print(f"\n/health after all of them: {alive}")
    if args.output:
        Path(args.output).write_text(table + f"\n\n/health after all of them: {alive}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
