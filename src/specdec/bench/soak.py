"""`specdec bench soak`: a bounded soak test of a running `specdec serve` on this machine.

    specdec bench soak --base-url http://127.0.0.1:8000 --requests 1000 --concurrency 16 [--max-seconds 3600]

Sends a seeded mix of requests, at most --concurrency at a time: completions and chats, streamed and not,
with stop strings or sampling; clients that vanish mid-stream or mid-wait; and bad inputs (broken JSON, wrong
types, unknown model, text/plain, oversized bodies and limits, lone surrogates). Each kind has an expected
outcome (200 with a complete body or stream, or its 4xx); anything else is an unexpected failure. It reads the
server's resident memory from /metrics (process_resident_memory_bytes) after the first 100 requests and at the
end, checks /health and that no request is left in flight, and exits 1 on any unexpected failure.

Loopback only: it refuses other hosts, so it cannot be pointed at somebody else's server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
RSS_BASELINE_AFTER = 100
RSS_METRIC = "process_resident_memory_bytes"
IN_FLIGHT_METRIC = "specdec:num_requests_in_flight"


@dataclass
class Outcome:
    kind: str
    ok: bool
    detail: str = ""


@dataclass
class SoakReport:
    requests: int = 0
    seconds: float = 0.0
    kinds: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    rss_after_first_100: float | None = None
    rss_end: float | None = None
    healthy_after: bool = False
    in_flight_after: float | None = None

    @property
    def rss_growth(self) -> float | None:
        if not self.rss_after_first_100 or self.rss_end is None:
            return None
        return self.rss_end / self.rss_after_first_100 - 1

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "seconds": round(self.seconds, 1), "kinds": dict(self.kinds),
                "unexpected_failures": len(self.failures), "failure_examples": self.failures[:20],
                "rss_mib_after_first_100": _mib(self.rss_after_first_100), "rss_mib_end": _mib(self.rss_end),
                "rss_growth": None if self.rss_growth is None else round(self.rss_growth, 4),
                "healthy_after": self.healthy_after, "in_flight_after": self.in_flight_after}


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


class Soak:
    def __init__(self, client: httpx.AsyncClient, model: str, max_tokens: int) -> None:
        self.client, self.model, self.max_tokens = client, model, max_tokens

    def body(self, rng: random.Random, chat: bool, **extra: Any) -> dict[str, Any]:
        words = " ".join(rng.choice(["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept"])
                         for _ in range(rng.randint(3, 60)))
        base: dict[str, Any] = {"model": self.model, "max_tokens": rng.randint(1, self.max_tokens),
                                "temperature": rng.choice([0, 0, 0.7])}
        if base["temperature"]:
            base["seed"] = rng.randint(0, 10**6)
        if chat:
            base["messages"] = [{"role": "user", "content": words}]
        else:
            base["prompt"] = words
        return {**base, **extra}

    # ---- kinds: each returns an Outcome ----

    async def full(self, rng: random.Random, chat: bool) -> Outcome:
        kind = "chat" if chat else "completion"
        extra = {"stop": ["\n\n"]} if rng.random() < 0.3 else {}
        r = await self.client.post(_path(chat), json=self.body(rng, chat, **extra))
        if r.status_code != 200:
            return Outcome(kind, False, f"{kind}: {r.status_code} {r.text[:200]}")
        choice = r.json()["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        ok = isinstance(text, str) and choice["finish_reason"] in ("stop", "length")
        return Outcome(kind, ok, "" if ok else f"{kind}: bad body {r.text[:200]}")

    async def stream(self, rng: random.Random, chat: bool, vanish: bool) -> Outcome:
        kind = ("chat" if chat else "completion") + ("_stream_vanish" if vanish else "_stream")
        body = self.body(rng, chat, stream=True)
        if vanish:
            body["max_tokens"] = self.max_tokens
        chunks, done = 0, False
        async with self.client.stream("POST", _path(chat), json=body) as r:
            if r.status_code != 200:
                return Outcome(kind, False, f"{kind}: {r.status_code}")
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                data = json.loads(line[6:])
                if "error" in data:
                    return Outcome(kind, False, f"{kind}: error event {line[:200]}")
                chunks += 1
                if vanish and chunks >= 2:
                    return Outcome(kind, True)  # leaving the block closes the connection mid-stream
        return Outcome(kind, done or vanish, "" if done or vanish else f"{kind}: stream ended without [DONE]")

    async def vanish_waiting(self, rng: random.Random) -> Outcome:
        body = self.body(rng, False, max_tokens=self.max_tokens)
        try:
            await self.client.post(_path(False), json=body, timeout=httpx.Timeout(30, read=0.2))
        except httpx.TimeoutException:
            pass  # the client gave up; the server must cancel the generation
        return Outcome("completion_vanish", True)

    async def bad(self, rng: random.Random) -> Outcome:
        cases: list[tuple[str, dict[str, Any], int]] = [
            ("broken_json", {"content": b'{"model": ', "headers": {"content-type": "application/json"}}, 400),
            ("wrong_type", {"json": {"model": self.model, "prompt": "hi", "max_tokens": "many"}}, 400),
            ("unknown_model", {"json": {"model": "nope", "prompt": "hi"}}, 404),
            ("text_plain", {"content": b'{"model": "x", "prompt": "hi"}', "headers": {"content-type": "text/plain"}},
             415),
            ("max_tokens_huge", {"json": {"model": self.model, "prompt": "hi", "max_tokens": 10**9}}, 400),
            ("empty_messages", {"json": {"model": self.model, "messages": []}}, 400),
            ("lone_surrogate", {"content": b'{"model": "%s", "prompt": "\\udfff"}' % self.model.encode(),
                                "headers": {"content-type": "application/json"}}, 400),
            ("oversized_body", {"content": b"x" * (5 * 2**20), "headers": {"content-type": "application/json"}}, 413),
            ("negative_temperature", {"json": {"model": self.model, "prompt": "hi", "temperature": -1}}, 400),
        ]
        name, kwargs, status = rng.choice(cases)
        r = await self.client.post(_path(chat="messages" in kwargs.get("json", {})), **kwargs)
        ok = r.status_code == status and "error" in r.json()
        return Outcome("bad_" + name, ok, "" if ok else f"bad_{name}: {r.status_code} (expected {status}) {r.text[:200]}")

    def pick(self, rng: random.Random) -> Callable[[], Awaitable[Outcome]]:
        roll = rng.random()
        chat = rng.random() < 0.4
        if roll < 0.30:
            return lambda: self.full(rng, chat)
        if roll < 0.60:
            return lambda: self.stream(rng, chat, vanish=False)
        if roll < 0.70:
            return lambda: self.stream(rng, chat, vanish=True)
        if roll < 0.75:
            return lambda: self.vanish_waiting(rng)
        return lambda: self.bad(rng)


def _path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


async def _metric(client: httpx.AsyncClient, name: str) -> float | None:
    """A sample of the server's /metrics (the first with that name), or None."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    return None


async def run_soak(base_url: str, requests: int, concurrency: int, max_tokens: int, max_seconds: float,
                   seed: int, api_key: str | None = None, progress: bool = True) -> SoakReport:
    from tqdm import tqdm

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    report = SoakReport()
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=headers, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        soak = Soak(client, model, max_tokens)
        rng = random.Random(seed)
        jobs = [soak.pick(random.Random(rng.random())) for _ in range(requests)]
        started = time.monotonic()
        bar = tqdm(total=requests, desc="soak", unit="req", disable=not progress)
        queue: asyncio.Queue[Callable[[], Awaitable[Outcome]]] = asyncio.Queue()
        for job in jobs:
            queue.put_nowait(job)

        async def worker() -> None:
            while not queue.empty() and time.monotonic() - started < max_seconds:
                job = queue.get_nowait()
                try:
                    outcome = await job()
                except Exception as exc:  # noqa: BLE001 - a transport error is a failure to report, not a crash
                    outcome = Outcome("transport", False, f"{type(exc).__name__}: {exc}")
                report.requests += 1
                report.kinds[outcome.kind] += 1
                if not outcome.ok:
                    report.failures.append(outcome.detail)
                bar.update(1)
                if report.requests == RSS_BASELINE_AFTER:
                    report.rss_after_first_100 = await _metric(client, RSS_METRIC)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        bar.close()
        report.seconds = time.monotonic() - started
        for _ in range(100):  # cancelled generations retire at their next step boundary
            report.in_flight_after = await _metric(client, IN_FLIGHT_METRIC)
            if not report.in_flight_after:
                break
            await asyncio.sleep(0.1)
        report.rss_end = await _metric(client, RSS_METRIC)
        report.healthy_after = (await client.get("/health")).status_code == 200
    return report


def add_bench_soak_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-soak", help="soak-test a running server on this machine (mixed, hostile traffic)",
                       description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1 (loopback only)")
    p.add_argument("--requests", type=int, default=1000, help="requests to send (default 1000)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight at most (default 16)")
    p.add_argument("--max-tokens", type=int, default=32, help="largest max_tokens sent (default 32)")
    p.add_argument("--max-seconds", type=float, default=3600.0, help="stop sending after this long (default 3600)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", default=None, help="sent as `Authorization: Bearer <key>`")
    p.add_argument("--output-json", default=None, help="write the report here")
    p.set_defaults(func=cmd_bench_soak)


def cmd_bench_soak(args: argparse.Namespace) -> int:
    host = urlparse(args.base_url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"bench-soak only targets this machine ({', '.join(sorted(LOOPBACK))}), got {host!r}")
    for name in ("requests", "concurrency", "max_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    report = asyncio.run(run_soak(args.base_url, args.requests, args.concurrency, args.max_tokens,
                                  args.max_seconds, args.seed, args.api_key))
    out = report.to_dict()
    growth = out["rss_growth"]
    print(f"soak: {report.requests} requests in {report.seconds:.0f} s, {len(report.failures)} unexpected failures; "
          f"RSS {out['rss_mib_after_first_100']} MiB after the first {RSS_BASELINE_AFTER} -> {out['rss_mib_end']} MiB "
          f"at the end ({'n/a' if growth is None else f'{growth:+.1%}'}); healthy after: {report.healthy_after}; "
          f"in flight after: {report.in_flight_after}", file=sys.stderr)
    for line in report.failures[:10]:
        print(f"  {line}", file=sys.stderr)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(out, f, indent=2)
    print(json.dumps(out))
    ok = not report.failures and report.healthy_after and not report.in_flight_after
    return 0 if ok else 1
