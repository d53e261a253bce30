"""A very long prompt against a running `specdec serve`, while other streams run.

    .venv/bin/python scripts/serve_long_prompt.py --base-url http://127.0.0.1:8765 --server-pid PID \\
        --prompt-tokens 30000 --streams 4 --output out.json

Starts `--streams` streaming completions (short prompts, 256 tokens each), then sends one completion whose
prompt is about `--prompt-tokens` tokens of varied text. Reports whether the long request was served or
refused (status and the error message, which must name the limit), how long it took, the server's peak
resident memory (VmHWM of --server-pid) before and after, and for each stream the longest gap between two
of its tokens and how many tokens it received while the long prompt was being read (continuous batching with
chunked prefill: the streams must keep going).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import httpx


def _peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _stream(url: str, model: str, prompt: str, times: list[float], done: threading.Event) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": 256, "temperature": 0, "stream": True}
    with httpx.Client(timeout=None) as client, client.stream("POST", f"{url}/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.perf_counter())
    done.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--server-pid", type=int, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=30000)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    url = args.base_url.rstrip("/")
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    words = [f"item{i % 997} is number {i}, and the note says {i * 7 % 113}." for i in range(args.prompt_tokens)]
    # about 11-12 tokens per sentence in Gemma's tokenizer; trimmed to the asked length by the server's count
    long_prompt = " ".join(words[: args.prompt_tokens // 11]) + "\nSummarise the notes:"
    rss_before = _peak_rss_mib(args.server_pid) if args.server_pid else None
    streams = []
    for i in range(args.streams):
        times: list[float] = []
        done = threading.Event()
        t = threading.Thread(target=_stream, args=(url, model, f"Question: Tell me a story number {i}.\nAnswer:",
                                                    times, done), daemon=True)
        t.start()
        streams.append((times, done))
    while any(not times for times, _ in streams):  # every stream is producing before the long prompt arrives
        time.sleep(0.05)
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": long_prompt, "max_tokens": 16,
                                                   "temperature": 0}, timeout=None)
    end = time.perf_counter()
    for _, done in streams:
        done.wait()
    body = r.json()
    report = {
        "prompt_tokens_asked": args.prompt_tokens,
        "status": r.status_code,
        "prompt_tokens": body.get("usage", {}).get("prompt_tokens"),
        "error": body.get("error"),
        "seconds": round(end - start, 2),
        "server_peak_rss_mib_before": rss_before,
        "server_peak_rss_mib_after": _peak_rss_mib(args.server_pid) if args.server_pid else None,
        "streams": [{
            "tokens": len(times),
            "tokens_during_long_request": sum(start <= t <= end for t in times),
            "longest_gap_s": round(max((b - a for a, b in zip(times, times[1:])), default=0.0), 3),
        } for times, _ in streams],
    }
    print(json.dumps(report, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
