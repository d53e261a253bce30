"""`specdec bench serve`: a bounded load test against a running `specdec serve` (or any OpenAI server).

    specdec bench serve --base-url http://127.0.0.1:8000 --prompts FILE.jsonl --num-prompts 64 \\
        --max-concurrency 8 --max-tokens 64 [--endpoint completions|chat] [--output-json F] [--output-table F]

Sends N streamed requests (the first turn of each prompt-file line, cycled; for a line with given
`answers`, the whole conversation up to its last turn), at most C at a time, and
reports throughput and latency percentiles (mean, median, p90, p95, p99, max), as vLLM's `bench serve` does:

    TTFT   request sent -> first chunk with text
    ITL    gaps between successive chunks with text (a chunk holds all tokens of one verification step)
    TPOT   (e2e - TTFT) / (output tokens - 1), per request
    E2EL   request sent -> [DONE]

Completions prompts are rendered as `specdec bench` renders them without a chat template
("Question: {turn}\\nAnswer:"); chat sends the turn as one user message (a conversation with given answers
as alternating user/assistant messages). It also sums the per-response speculative figures
(`spec_decoding`) and compares them with the change of the server's /metrics counters over the run
(equal when no other traffic reached the server meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SPEC_KEYS = ("num_steps", "num_drafts", "num_draft_tokens", "num_accepted_tokens")
COUNTERS = {  # /metrics counter -> spec_decoding key
    "specdec:spec_decode_num_drafts_total": "num_drafts",
    "specdec:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "specdec:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
    "specdec:generation_tokens_total": "completion_tokens",
}
PERCENTILES = (50, 90, 95, 99)


def add_bench_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench-serve", help="load-test a running server (also spelled `specdec bench serve`)",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1")
    p.add_argument("--model", default=None, help="model name to send (default: the server's first in /v1/models)")
    p.add_argument("--prompts", required=True, help="jsonl: MT-Bench lines (turns) or {prompt} lines")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--num-prompts", type=int, default=64, help="requests to send (prompts are cycled; default 64)")
    p.add_argument("--max-concurrency", default="8",
                   help="requests in flight at most (default 8); a comma-separated list (1,4,16,32) runs once per value "
                        "and adds a summary of the output throughput against concurrency")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="sent with every request (sampling only)")
    p.add_argument("--ignore-eos", action="store_true", help="every request generates max_tokens (vLLM extension)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    p.add_argument("--output-json", default=None, help="write the report here")
    p.add_argument("--output-table", default=None, help="write the printed table here too")
    p.set_defaults(func=cmd_bench_serve)


@dataclass
class RequestResult:
    index: int
    ok: bool = False
    status: int | None = None
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    text: str = ""
    spec: dict[str, Any] | None = None


def load_prompts(path: str, n: int) -> list[Any]:
    """N questions of the file, cycled (`specdec.bench.prompts.Question`)."""
    from specdec.bench.prompts import load_questions

    questions = load_questions(path)
    if not questions:
        raise ValueError(f"no prompts in {path}")
    return [questions[i % len(questions)] for i in range(n)]


def request_body(prompt: Any, args: argparse.Namespace, model: str) -> dict[str, Any]:
    """`prompt`: a Question (its first turn, or with given answers its whole conversation) or one turn."""
    from specdec.bench.prompts import render_text

    if isinstance(prompt, str):
        turns, answers = [prompt], []
    elif prompt.answers is not None:
        turns, answers = list(prompt.turns), list(prompt.answers)
    else:
        turns, answers = list(prompt.turns[:1]), []
    body: dict[str, Any] = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature,
                            "stream": True, "stream_options": {"include_usage": True}}
    if args.endpoint == "chat":
        messages = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i].strip()})
        body["messages"] = messages
    else:
        body["prompt"] = render_text(turns, answers)
    if args.seed is not None:
        body["seed"] = args.seed
    if args.ignore_eos:
        body["ignore_eos"] = True
    return body


async def _one(client: Any, url: str, body: dict, index: int) -> RequestResult:
    result = RequestResult(index)
    start = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", url, json=body) as response:
            result.status = response.status_code
            if response.status_code != 200:
                raw = await response.aread()
                try:
                    result.error = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    result.error = raw.decode(errors="replace")[:500]
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    result.ok = result.finish_reason is not None
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("message")
                    break
                now = time.perf_counter()
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                    if text:
                        if result.ttft is None:
                            result.ttft = now - start
                        elif last is not None:
                            result.itl.append(now - last)
                        last = now
                        result.text += text
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.completion_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("spec_decoding"):
                    result.spec = chunk["spec_decoding"]
    except Exception as exc:  # noqa: BLE001 - a failed request is reported, not raised
        result.error = f"{type(exc).__name__}: {exc}"
    result.e2e = time.perf_counter() - start
    if result.ok and result.ttft is None:  # no text at all (e.g. immediate EOS)
        result.ttft = result.e2e
    return result


def scrape_counters(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in COUNTERS or sample.name == "specdec:request_success_total":
                key = sample.name
                if sample.name == "specdec:request_success_total":
                    key += f"{{{sample.labels.get('finished_reason')}}}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


async def run_load(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    base = args.base_url.rstrip("/")
    if args.num_prompts < 1 or args.max_concurrency < 1 or args.max_tokens < 1:
        raise ValueError("--num-prompts, --max-concurrency and --max-tokens must be >= 1")
    prompts = load_prompts(args.prompts, args.num_prompts)
    limits = httpx.Limits(max_connections=args.max_concurrency + 4, max_keepalive_connections=args.max_concurrency)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        try:
            models = (await client.get(f"{base}/v1/models")).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise ValueError(f"no OpenAI server at {base}: {exc}") from None
        model = args.model or models[0]["id"]
        speculative_config = next((m.get("speculative_config") for m in models if m["id"] == model), None)
        before = await _metrics(client, base)
        url = f"{base}/v1/{'chat/completions' if args.endpoint == 'chat' else 'completions'}"
        gate = asyncio.Semaphore(args.max_concurrency)

        async def limited(i: int, prompt: Any) -> RequestResult:
            async with gate:
                return await _one(client, url, request_body(prompt, args, model), i)

        started = time.perf_counter()
        results = await asyncio.gather(*(limited(i, t) for i, t in enumerate(prompts)))
        duration = time.perf_counter() - started
        after = await _metrics(client, base)
    return build_report(args, model, speculative_config, results, duration, before, after)


async def _metrics(client: Any, base: str) -> dict[str, float] | None:
    try:
        response = await client.get(f"{base}/metrics")
        return scrape_counters(response.text) if response.status_code == 200 else None
    except Exception:  # noqa: BLE001 - a server without /metrics
        return None


def _dist(values: list[float]) -> dict[str, float | None]:
    import numpy as np

    if not values:
        return {"mean": None, "median": None, **{f"p{p}": None for p in PERCENTILES[1:]}, "max": None}
    a = np.asarray(values) * 1000.0
    out = {"mean": float(a.mean()), "median": float(np.median(a))}
    out.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES[1:]})
    out["max"] = float(a.max())
    return {k: round(v, 3) for k, v in out.items()}


def build_report(args: argparse.Namespace, model: str, speculative_config: Any, results: list[RequestResult],
                 duration: float, before: dict | None, after: dict | None) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.completion_tokens - 1) for r in ok if r.completion_tokens > 1]
    spec = {k: sum((r.spec or {}).get(k, 0) for r in ok) for k in SPEC_KEYS}
    spec["acceptance_rate"] = round(spec["num_accepted_tokens"] / spec["num_draft_tokens"], 4) \
        if spec["num_draft_tokens"] else None
    spec["mean_acceptance_length"] = round((spec["num_accepted_tokens"] + spec["num_steps"]) / spec["num_steps"], 4) \
        if spec["num_steps"] else None
    check = None
    if before is not None and after is not None:
        delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
        sums = {**spec, "completion_tokens": out_tokens}
        rows = {name: {"metrics_delta": int(delta.get(name, 0)), "sum_of_responses": int(sums[key])}
                for name, key in COUNTERS.items()}
        check = {"counters": rows, "requests_finished_delta": {k: int(v) for k, v in delta.items() if "{" in k},
                 "match": all(r["metrics_delta"] == r["sum_of_responses"] for r in rows.values())}
    return {
        "base_url": args.base_url, "model": model, "endpoint": args.endpoint, "speculative_config": speculative_config,
        "prompts": args.prompts, "num_prompts": args.num_prompts, "max_concurrency": args.max_concurrency,
        "max_tokens": args.max_tokens, "temperature": args.temperature, "ignore_eos": args.ignore_eos,
        "completed": len(ok), "failed": len(failed),
        "errors": [{"index": r.index, "status": r.status, "error": r.error} for r in failed[:10]],
        "duration_s": round(duration, 3),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": round(len(ok) / duration, 4) if duration else None,
        "output_throughput": round(out_tokens / duration, 3) if duration else None,
        "total_token_throughput": round((in_tokens + out_tokens) / duration, 3) if duration else None,
        "ttft_ms": _dist([r.ttft for r in ok]),
        "tpot_ms": _dist(tpot),
        "itl_ms": _dist([g for r in ok for g in r.itl]),
        "e2el_ms": _dist([r.e2e for r in ok]),
        "spec_decoding": spec,
        "metrics_check": check,
        "per_request": [
            {k: v for k, v in asdict(r).items() if k not in ("itl",)} | {"num_chunks": len(r.itl) + (r.ttft is not None)}
            for r in results
        ],
    }


def format_table(report: dict[str, Any]) -> str:
    lines = []

    def row(label: str, value: Any) -> None:
        lines.append(f"{label:<44}{value if value is not None else '-'}")

    def title(text: str) -> None:
        lines.append(f"{' ' + text + ' ':-^60}")

    lines.append(f"{' specdec bench serve ':=^60}")
    row("Endpoint:", f"/v1/{'chat/completions' if report['endpoint'] == 'chat' else 'completions'}")
    row("Model:", report["model"])
    row("Speculative config:", json.dumps(report["speculative_config"]))
    row("Successful requests:", report["completed"])
    row("Failed requests:", report["failed"])
    row("Maximum concurrency:", report["max_concurrency"])
    row("Benchmark duration (s):", f"{report['duration_s']:.2f}")
    row("Total input tokens:", report["total_input_tokens"])
    row("Total generated tokens:", report["total_output_tokens"])
    row("Request throughput (req/s):", report["request_throughput"])
    row("Output token throughput (tok/s):", report["output_throughput"])
    row("Total token throughput (tok/s):", report["total_token_throughput"])
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL")):
        title({"TTFT": "Time to First Token", "TPOT": "Time per Output Token (excl. 1st token)",
               "ITL": "Inter-token Latency (per chunk)", "E2EL": "End-to-end Latency"}[name])
        d = report[key]
        for stat in ("mean", "median", "p90", "p95", "p99", "max"):
            value = d[stat]
            row(f"{stat.capitalize() if stat in ('mean', 'median', 'max') else stat.upper()} {name} (ms):",
                f"{value:.2f}" if value is not None else None)
    title("Speculative decoding (sum of responses)")
    s = report["spec_decoding"]
    row("Verification steps:", s["num_steps"])
    row("Drafts / draft tokens / accepted:", f"{s['num_drafts']} / {s['num_draft_tokens']} / {s['num_accepted_tokens']}")
    row("Acceptance rate:", s["acceptance_rate"])
    row("Mean acceptance length (tokens/forward):", s["mean_acceptance_length"])
    check = report["metrics_check"]
    row("/metrics counters == sums of responses:", "n/a" if check is None else ("yes" if check["match"] else "NO"))
    for e in report["errors"][:3]:
        row("Error:", f"#{e['index']} status {e['status']}: {e['error']}")
    lines.append("=" * 60)
    return "\n".join(lines)


def _concurrencies(text: str | int) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--max-concurrency takes integers separated by commas, got {text!r}") from None
    if not values:
        raise ValueError("--max-concurrency needs at least one value")
    return values


def cmd_bench_serve(args: argparse.Namespace) -> int:
    values = _concurrencies(args.max_concurrency)
    if len(values) == 1:
        args.max_concurrency = values[0]
        return _one_run(args)
    reports = []
    for c in values:
        one = argparse.Namespace(**vars(args))
        one.max_concurrency, one.output_json, one.output_table = c, None, None
        reports.append(asyncio.run(run_load(one)))
        print(format_table(reports[-1]), flush=True)
    base = reports[0]["output_throughput"] or 0
    summary = [{"max_concurrency": r["max_concurrency"], "output_throughput": r["output_throughput"],
                "vs_first": round(r["output_throughput"] / base, 3) if base and r["output_throughput"] else None,
                "failed": r["failed"], "median_ttft_ms": r["ttft_ms"]["median"], "median_itl_ms": r["itl_ms"]["median"],
                "mean_acceptance_length": r["spec_decoding"]["mean_acceptance_length"]} for r in reports]
    lines = [f"{'concurrency':>11} {'out tok/s':>10} {'vs first':>9} {'failed':>7} {'TTFT p50 ms':>12} {'ITL p50 ms':>11}"]
    for r in summary:
        lines.append(f"{r['max_concurrency']:>11} {r['output_throughput']:>10} {r['vs_first'] or '-':>9} {r['failed']:>7} "
                     f"{r['median_ttft_ms'] or 0:>12.1f} {r['median_itl_ms'] or 0:>11.1f}")
    table = "\n".join(lines)
    print(table, flush=True)
    if args.output_table:
        Path(args.output_table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_table).write_text("\n\n".join(format_table(r) for r in reports) + "\n\n" + table + "\n")
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps({"summary": summary, "runs": reports}, indent=2) + "\n")
    return 0 if all(r["failed"] == 0 for r in reports) else 1


def _one_run(args: argparse.Namespace) -> int:
    report = asyncio.run(run_load(args))
    table = format_table(report)
    print(table, flush=True)
    if args.output_table:
        Path(args.output_table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_table).write_text(table + "\n")
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        print(f"report written to {args.output_json}", file=sys.stderr)
    return 0 if report["failed"] == 0 else 1
