"""Issue 24's server items, each with a test that failed before its fix: nothing a client sends (or fails to
read) can crash, stall or bloat the server. The app runs in-process on a tiny model (httpx's ASGI transport),
so a test can make the tokenizer slow or the worker die."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time

import httpx
import pytest

from specdec.sampling_params import SamplingParams
from specdec.serving.app import create_app
from specdec.serving.generation import MAX_PENDING_EVENTS, Generation, StepEvent
from specdec.serving.server import add_serve_parser, build_state
from specdec.serving.tokenizer_pool import TokenizerPool

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def serve_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *extra])


@pytest.fixture(scope="module")
def state(zoo):
    args = serve_args("--model", zoo.path("llama"), "--device", "cpu", "--threads", "1", "--served-model-name", "tiny",
                      "--max-model-len", "2048", "--api-key", KEY, "--allowed-hosts", "127.0.0.1", "localhost",
                      "--body-timeout", "1", "--no-warmup", "--max-num-seqs", "2")
    state = build_state(args)
    state.scheduler.start()
    yield state
    state.scheduler.stop()


@pytest.fixture(scope="module")
def app(state):
    return create_app(state)


def call(app, *requests):
    """Runs the requests ((method, path, kwargs) each) concurrently against the app; returns the responses."""

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as client:
            return await asyncio.gather(*(client.request(m, p, **kw) for m, p, kw in requests))

    return asyncio.run(run())


def completion(prompt="hello", **extra) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}


# ---- item 3: access control ----

V1_ROUTES = [("GET", "/v1/models"), ("GET", "/v1/models/tiny"), ("POST", "/v1/completions"),
             ("POST", "/v1/chat/completions")]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}],
                         ids=["no-key", "wrong-key", "no-bearer"])
def test_every_v1_route_needs_the_api_key(app, headers):
    body = {"json": completion(), "headers": headers}
    responses = call(app, *[(m, p, body if m == "POST" else {"headers": headers}) for m, p in V1_ROUTES])
    for (method, path), r in zip(V1_ROUTES, responses):
        assert r.status_code == 401, (method, path, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"


def test_the_key_opens_the_routes_and_health_stays_open(app):
    ok, health, metrics = call(app, ("POST", "/v1/completions", {"json": completion(), "headers": AUTH}),
                               ("GET", "/health", {}), ("GET", "/metrics", {}))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    assert health.status_code == 200 and metrics.status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_post_that_is_not_json_gets_415(app, content_type):
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    (r,) = call(app, ("POST", "/v1/completions", {"content": b'{"model": "tiny", "prompt": "hi"}', "headers": headers}))
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_json_with_a_charset_is_accepted(app):
    headers = {**AUTH, "Content-Type": "application/json; charset=utf-8"}
    (r,) = call(app, ("POST", "/v1/completions", {"content": b'{"model": "tiny", "prompt": "hi", "max_tokens": 2}',
                                                   "headers": headers}))
    assert r.status_code == 200


def test_an_unlisted_host_header_is_refused(app):
    (r,) = call(app, ("GET", "/v1/models", {"headers": {**AUTH, "Host": "attacker.example"}}))
    assert r.status_code == 400


def test_a_body_that_never_finishes_arriving_gets_408(app):
    async def trickle():
        yield b'{"model": "tiny", '
        await asyncio.sleep(3)  # the server's --body-timeout is 1 s
        yield b'"prompt": "hi"}'

    started = time.monotonic()
    (r,) = call(app, ("POST", "/v1/completions", {"content": trickle(), "headers": {**AUTH,
                                                                                   "Content-Type": "application/json"}}))
    assert r.status_code == 408 and time.monotonic() - started < 2.5


# ---- item 2: nothing blocking on the event loop ----

def test_tokenizing_runs_off_the_event_loop(state, app, monkeypatch):
    """While a slow tokenization runs, /health answers at once (before: tokenizing ran on the event loop)."""
    slow = threading.Event()

    class SlowTokenizer:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, *args, **kwargs):
            slow.set()
            time.sleep(1.5)
            return self.inner(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __deepcopy__(self, memo):
            return self

    pool = state.tokenizers
    monkeypatch.setattr(state, "tokenizers", TokenizerPool(SlowTokenizer(pool._tokenizer), size=1))

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as client:
            slow_request = asyncio.ensure_future(client.post("/v1/completions", json=completion(), headers=AUTH))
            while not slow.is_set():
                assert not slow_request.done(), slow_request.result().text
                await asyncio.sleep(0.01)
            started = time.monotonic()
            health = await client.get("/health")
            waited = time.monotonic() - started
            return health, waited, await slow_request

    health, waited, done = asyncio.run(run())
    assert health.status_code == 200 and waited < 0.5, waited
    assert done.status_code == 200


def test_the_tokenizer_pool_caps_work_in_flight():
    running, most = 0, 0
    lock = threading.Lock()

    def work(_tokenizer):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return _tokenizer

    async def run():
        pool = TokenizerPool(object(), size=2)
        return await asyncio.gather(*(pool.run(work) for _ in range(8)))

    copies = asyncio.run(run())
    assert most == 2 and len({id(c) for c in copies}) == 2  # two threads at most, each with its own copy


def test_a_text_far_beyond_the_prompt_limit_is_refused_before_tokenizing(state, app, monkeypatch):
    def never(_work):
        raise AssertionError("tokenized a prompt that could only be refused")

    monkeypatch.setattr(state.tokenizers, "run", never)
    huge = "x" * (state.limits.max_prompt_chars + 1)
    r1, r2 = call(app, ("POST", "/v1/completions", {"json": completion(huge), "headers": AUTH}),
                  ("POST", "/v1/chat/completions", {"json": {"model": "tiny", "messages": [
                      {"role": "user", "content": huge}]}, "headers": AUTH}))
    for r in (r1, r2):
        assert r.status_code == 400 and "characters" in r.json()["error"]["message"]


# ---- item 4: bounded streams ----

def test_events_carry_only_new_text_and_the_mailbox_is_bounded():
    async def run():
        gen = Generation("r", [1], SamplingParams(max_tokens=5000), time.monotonic(), asyncio.get_running_loop())
        for i in range(5000):  # a client that reads nothing while 5000 steps are posted
            gen.post(StepEvent("ab", i + 1))
        assert len(gen._pending) == MAX_PENDING_EVENTS
        gen.post(StepEvent("c", 5001, finish_reason="length", text="ab" * 5000 + "c"))
        events = await gen.take(1.0)
        return events

    events = asyncio.run(run())
    assert len(events) == MAX_PENDING_EVENTS
    assert "".join(e.delta for e in events) == "ab" * 5000 + "c"  # memory O(output), not O(output^2)
    assert sum(len(e.delta) for e in events) == 10001
    assert events[-1].final and events[-1].num_output_tokens == 5001


def test_a_client_that_stops_reading_is_cancelled(state, caplog):
    scheduler = state.scheduler
    old, scheduler.stall_timeout = scheduler.stall_timeout, 0.3
    try:
        async def run():
            loop = asyncio.get_running_loop()
            params = SamplingParams(max_tokens=1900, temperature=0, ignore_eos=True)
            gen = Generation("stalled", [1, 5, 6], params, time.monotonic(), loop)
            scheduler.submit(gen)
            started = time.monotonic()
            while not gen.done and time.monotonic() - started < 30:
                await asyncio.sleep(0.05)  # never takes its events
            waited = time.monotonic() - started
            events = await gen.take(1.0)
            scheduler.release(gen)
            return events, waited

        with caplog.at_level(logging.WARNING, logger="specdec.serving"):
            events, waited = asyncio.run(run())
    finally:
        scheduler.stall_timeout = old
    assert events[-1].finish_reason == "abort" and waited < 10
    assert max(e.num_output_tokens for e in events) < 1900  # stopped long before max_tokens
    assert any("has read nothing" in r.getMessage() for r in caplog.records)


def test_finished_generations_count_against_the_limit_until_released(state):
    """A finished request whose response is still being sent counts (before: it stopped counting at once)."""
    scheduler = state.scheduler
    limit = scheduler.max_num_seqs + scheduler.max_waiting

    async def run():
        loop = asyncio.get_running_loop()
        gens = []
        for i in range(limit):
            gen = Generation(f"g{i}", [1, 5], SamplingParams(max_tokens=1, temperature=0), time.monotonic(), loop)
            scheduler.submit(gen)
            gens.append(gen)
        while not all(g.done for g in gens):
            await asyncio.sleep(0.02)
        extra = Generation("extra", [1, 5], SamplingParams(max_tokens=1), time.monotonic(), loop)
        with pytest.raises(Exception) as refused:
            scheduler.submit(extra)
        assert refused.value.status == 429
        assert state.metrics.in_flight_gauge._value.get() == limit
        for g in gens:
            scheduler.release(g)
            scheduler.release(g)  # idempotent
        scheduler.submit(extra)
        scheduler.release(extra)

    asyncio.run(run())
    assert scheduler.active == 0


# ---- item 5: a dead worker fails fast ----

def test_a_dead_worker_fails_waiting_requests_and_new_ones_get_503(zoo, caplog):
    args = serve_args("--model", zoo.path("llama"), "--device", "cpu", "--threads", "1", "--served-model-name", "tiny",
                      "--max-model-len", "2048", "--no-warmup")
    state = build_state(args)
    app = create_app(state)

    def die():
        raise SystemExit("simulated crash")  # a BaseException: the per-step `except Exception` does not catch it

    state.scheduler.batch.step = die
    state.scheduler.start()
    try:
        with caplog.at_level(logging.CRITICAL, logger="specdec.serving"):
            first, = call(app, ("POST", "/v1/completions", {"json": completion()}))
        assert first.status_code == 503 and first.json()["error"]["code"] == "worker_down"
        assert "simulated crash" in first.json()["error"]["message"]
        assert any("generation worker died" in r.getMessage() for r in caplog.records)
        later, health = call(app, ("POST", "/v1/completions", {"json": completion()}), ("GET", "/health", {}))
        assert later.status_code == 503 and health.status_code == 503
        assert state.scheduler.active == 0
    finally:
        state.scheduler.stop()


# ---- item 6: drafter weights load once ----

def test_a_draft_model_loads_once_for_every_slot(zoo, monkeypatch):
    import specdec.models.loading as loading

    loads = []
    real = loading.load_model

    def counting(path, *args, **kwargs):
        loads.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(loading, "load_model", counting)
    draft = zoo.path("llama_draft")
    args = serve_args("--model", zoo.path("llama"), "--device", "cpu", "--threads", "1", "--served-model-name", "tiny",
                      "--max-model-len", "2048", "--no-warmup", "--max-num-seqs", "4", "--speculative-config",
                      f'{{"method": "draft_model", "model": "{draft}", "num_speculative_tokens": 3}}')
    state = build_state(args)
    app = create_app(state)
    state.scheduler.start()
    try:
        responses = call(app, *[("POST", "/v1/completions", {"json": completion(f"hello {i}", max_tokens=32)})
                                for i in range(4)])
        assert all(r.status_code == 200 for r in responses)
        # several slots ran at once, each with its own proposer (how many overlapped depends on the machine's
        # load: one request can finish before the last one is admitted)
        assert 2 <= len(state.scheduler.batch._proposers) <= 4
        runtimes = {id(p.runtime.decoder) for p in state.scheduler.batch._proposers}
        assert len(runtimes) == 1  # ... sharing one copy of the draft model's weights
    finally:
        state.scheduler.stop()
    assert loads.count(draft) == 1


# ---- the soak command itself, briefly ----

def test_a_short_soak_has_no_unexpected_failures(zoo):
    from serve_helpers import ServerProcess

    from specdec.bench.soak import run_soak

    proc = ServerProcess("--model", zoo.path("llama"), "--device", "cpu", "--threads", "1", "--served-model-name",
                         "tiny", "--max-model-len", "2048", "--max-tokens-limit", "64").start()
    try:
        report = asyncio.run(run_soak(proc.base_url, requests=120, concurrency=8, max_tokens=32, max_seconds=300,
                                      seed=3, progress=False))
    finally:
        proc.stop()
    assert report.requests == 120 and not report.failures, report.failures[:5]
    assert report.healthy_after and report.in_flight_after == 0
    assert report.rss_after_first_100 and report.rss_end
    kinds = set(report.kinds)
    for family in ("completion", "chat", "_stream", "_stream_vanish", "completion_vanish", "bad_"):
        assert any(family in k for k in kinds), (family, kinds)  # every kind of traffic was sent


def test_the_api_key_comes_from_the_environment_too(monkeypatch):
    monkeypatch.setenv("SPECDEC_API_KEY", "sk-from-env")
    assert serve_args().api_key == "sk-from-env"
    assert serve_args("--api-key", "sk-flag").api_key == "sk-flag"  # the flag wins


def test_the_default_kv_budget_and_prompt_limit_follow_the_free_memory(zoo, monkeypatch):
    """Without --kv-cache-memory-gib the KV budget is half the free memory, at most 4 GiB, and the longest
    accepted prompt is the one whose KV cache fits in it: less free memory, shorter prompts."""
    import types

    import psutil

    from specdec.serving import server

    def free(gib: float) -> None:
        monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=int(gib * 2**30)))

    free(100)
    assert server.kv_cache_budget(None) == 4 * 2**30
    free(1)
    assert server.kv_cache_budget(None) == 2**29
    assert server.kv_cache_budget(0.25) == 2**28  # asked for: as asked
    limits = []
    for gib in (0.002, 0.001):
        free(gib)
        state = build_state(serve_args("--model", zoo.path("llama"), "--device", "cpu", "--no-warmup",
                                       "--max-model-len", "100000"))
        limits.append(state.limits.max_prompt_tokens)
        budget = state.scheduler.batch.config.kv_cache_memory_bytes
        assert budget == int(gib * 2**30 * server.KV_SHARE_OF_FREE_MEMORY)
        assert state.limits.max_prompt_tokens == server.prompt_tokens_within(budget, zoo.load("llama").kv_bytes_per_token)
    assert limits[1] < limits[0] < 100000 - 1


def test_serve_hands_its_connection_limits_to_uvicorn(zoo, monkeypatch):
    import uvicorn

    from specdec.serving.server import cmd_serve

    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(kwargs))
    args = serve_args("--model", zoo.path("llama"), "--device", "cpu", "--no-warmup", "--max-connections", "7",
                      "--timeout-keep-alive", "3")
    assert cmd_serve(args) == 0
    assert seen["limit_concurrency"] == 7 and seen["timeout_keep_alive"] == 3
