"""A very long prompt against a running `specdec serve`, while short streams keep running.

    .venv/bin/python scripts/serve_long_prompt.py --base-url http://127.0.0.1:8765 --server-pid PID \\
        --prompt-tokens 30000 --streams 1 --output out.json

Starts `--streams` streaming completions (short prompts; each restarts when it ends, so they run throughout),
measures their inter-token gaps alone for --baseline-seconds, then sends one completion whose prompt is about
`--prompt-tokens` tokens of varied text. Reports whether the long request was served or refused (status, and
the error message, which must name the limit), how long it took, the server's resident and peak resident
memory (VmRSS, VmHWM of --server-pid) before and after, and the streams' gaps between chunks before and
during the long request (mean, p90, max) with their ratio: chunked, paced prefill must keep the streams going.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import httpx


def _memory_mib(pid: int, field: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _streams(url: str, model: str, prompt: str, requests: list[list[float]], stop: threading.Event) -> None:
    """Streams the prompt again and again until `stop`; appends each request's chunk times to `requests`."""
    body = {"model": model, "prompt": prompt, "max_tokens": 512, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=None) as client:
        while not stop.is_set():
            times: list[float] = []
            requests.append(times)
            with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if stop.is_set():
                        break
                    if line.startswith("data: ") and line != "data: [DONE]":
                        times.append(time.perf_counter())


def _gaps(requests: list[list[float]], start: float, end: float) -> list[float]:
    """Gaps between successive chunks of one request that end within [start, end] (a request's first chunk
    ends no gap: it waited for its prompt to be read)."""
    return [b - a for times in requests for a, b in zip(times, times[1:]) if start <= b <= end]


def _summary(gaps: list[float]) -> dict[str, float | int | None]:
    if not gaps:
        return {"n": 0, "mean_s": None, "p90_s": None, "max_s": None}
    ordered = sorted(gaps)
    return {"n": len(gaps), "mean_s": round(statistics.fmean(gaps), 4),
            "p90_s": round(ordered[int(0.9 * (len(ordered) - 1))], 4), "max_s": round(ordered[-1], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--server-pid", type=int, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=30000)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--baseline-seconds", type=float, default=15.0)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    url = args.base_url.rstrip("/")
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    words = [f"item{i % 997} is number {i}, and the note says {i * 7 % 113}." for i in range(args.prompt_tokens)]
    # about 19.5 tokens per sentence in Gemma's tokenizer (53,177 tokens for 2,727 sentences)
    long_prompt = " ".join(words[: int(args.prompt_tokens / 19.5)]) + "\nSummarise the notes:"
    pid = args.server_pid
    memory_before = {f: _memory_mib(pid, f) for f in ("VmRSS", "VmHWM")} if pid else {}
    stop = threading.Event()
    streams: list[list[list[float]]] = [[] for _ in range(args.streams)]  # per stream, per request: chunk times
    for i, requests in enumerate(streams):
        threading.Thread(target=_streams, args=(url, model, f"Question: Tell me a story number {i}.\nAnswer:",
                                                requests, stop), daemon=True).start()
    while any(not requests or len(requests[0]) < 2 for requests in streams):
        time.sleep(0.05)
    baseline_start = time.perf_counter()
    time.sleep(args.baseline_seconds)
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": long_prompt, "max_tokens": 16,
                                                   "temperature": 0}, timeout=None)
    end = time.perf_counter()
    stop.set()
    body = r.json()
    before = [g for requests in streams for g in _gaps(requests, baseline_start, start)]
    during = [g for requests in streams for g in _gaps(requests, start, end)]
    b, d = _summary(before), _summary(during)
    report = {
        "prompt_tokens_asked": args.prompt_tokens,
        "status": r.status_code,
        "prompt_tokens": body.get("usage", {}).get("prompt_tokens"),
        "error": body.get("error"),
        "seconds": round(end - start, 2),
        "server_memory_mib_before": memory_before,
        "server_memory_mib_after": {f: _memory_mib(pid, f) for f in ("VmRSS", "VmHWM")} if pid else {},
        "gaps_before": b,
        "gaps_during": d,
        "mean_gap_ratio": round(d["mean_s"] / b["mean_s"], 3) if b["mean_s"] and d["mean_s"] else None,
        "p90_gap_ratio": round(d["p90_s"] / b["p90_s"], 3) if b["p90_s"] and d["p90_s"] else None,
    }
    print(json.dumps(report, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
