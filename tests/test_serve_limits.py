"""Limits and cancellation on a real server with 1 running + 1 queued request at most: the queue-full 429,
and a client that disconnects (streamed or not, running or queued) cancels its generation."""

from __future__ import annotations

import time

import httpx
import pytest

from serve_helpers import ServerProcess, scrape

MAX_TOKENS = 1990  # about 5 s of plain decoding on the wide tiny model: far longer than any test waits


@pytest.fixture(scope="module")
def server(zoo):
    proc = ServerProcess(
        "--model", zoo.path("wide_llama"), "--device", "cpu", "--threads", "1", "--served-model-name", "wide",
        "--max-model-len", "2048", "--max-tokens-limit", "2000", "--max-num-seqs", "1", "--max-waiting", "1",
    ).start()
    yield proc
    proc.stop()


def _long(stream: bool) -> dict:
    return {"model": "wide", "prompt": "hello", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def _wait_for(base_url: str, check, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(base_url)
        if check(m):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never reached the expected state: {m}")
        time.sleep(0.05)


def _aborted(m: dict) -> float:
    return m.get("specdec:request_success_total{finished_reason=abort}", 0)


def _open_stream(client: httpx.Client, wait_first_chunk: bool):
    cm = client.stream("POST", "/v1/completions", json=_long(True))
    response = cm.__enter__()
    assert response.status_code == 200
    lines = response.iter_lines()
    if wait_first_chunk:
        assert next(line for line in lines if line.startswith("data: "))
    return cm, lines


def test_queue_full_429_and_stream_disconnects_cancel(server):
    base = server.base_url
    start = scrape(base)
    with httpx.Client(base_url=base, timeout=60) as a, httpx.Client(base_url=base, timeout=60) as b:
        cm_a, lines_a = _open_stream(a, wait_first_chunk=True)  # running
        cm_b, lines_b = _open_stream(b, wait_first_chunk=False)  # queued behind it
        m = _wait_for(base, lambda m: m["specdec:num_requests_waiting"] == 1)
        assert m["specdec:num_requests_running"] == 1
        r = httpx.post(base + "/v1/completions", json=_long(False), timeout=30)
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "queue_full" and "too many requests" in r.json()["error"]["message"]
        assert r.headers.get("retry-after") == "1"

        cm_a.__exit__(None, None, None)  # client A goes away: its generation stops, B starts
        _wait_for(base, lambda m: _aborted(m) == _aborted(start) + 1)
        assert next(line for line in lines_b if line.startswith("data: "))
        cm_b.__exit__(None, None, None)
        end = _wait_for(base, lambda m: _aborted(m) == _aborted(start) + 2 and m["specdec:num_requests_running"] == 0)
    assert end["specdec:num_requests_waiting"] == 0
    generated = end["specdec:generation_tokens_total"] - start["specdec:generation_tokens_total"]
    assert generated < MAX_TOKENS  # both stopped long before their max_tokens
    assert end.get("specdec:request_rejected_total{status=429}", 0) >= 1


def test_queued_request_cancelled_before_it_starts(server):
    base = server.base_url
    start = scrape(base)
    with httpx.Client(base_url=base, timeout=60) as a, httpx.Client(base_url=base, timeout=60) as b:
        # (keep the line iterators: a dropped, half-read one closes its connection, i.e. disconnects)
        cm_a, lines_a = _open_stream(a, wait_first_chunk=True)
        cm_b, lines_b = _open_stream(b, wait_first_chunk=False)
        _wait_for(base, lambda m: m["specdec:num_requests_waiting"] == 1)
        cm_b.__exit__(None, None, None)  # leaves the queue without ever running
        m = _wait_for(base, lambda m: m["specdec:num_requests_waiting"] == 0)
        assert _aborted(m) == _aborted(start) + 1 and m["specdec:num_requests_running"] == 1
        prompt_tokens = m["specdec:prompt_tokens_total"] - start["specdec:prompt_tokens_total"]
        cm_a.__exit__(None, None, None)
    _wait_for(base, lambda m: _aborted(m) == _aborted(start) + 2 and m["specdec:num_requests_running"] == 0)
    assert prompt_tokens == 1 + len("hello")  # <bos> + bytes of A's prompt only: B never started


def test_non_streamed_request_cancelled_when_its_client_gives_up(server):
    base = server.base_url
    start = scrape(base)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/v1/completions", json=_long(False), timeout=httpx.Timeout(30, read=0.5))
    end = _wait_for(base, lambda m: _aborted(m) == _aborted(start) + 1 and m["specdec:num_requests_running"] == 0)
    assert end["specdec:generation_tokens_total"] - start["specdec:generation_tokens_total"] < MAX_TOKENS
    # and the server goes on serving
    r = httpx.post(base + "/v1/completions", json={"model": "wide", "prompt": "hi", "max_tokens": 5, "temperature": 0},
                   timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 5
    assert server.alive()


def test_a_prompt_whose_kv_cache_can_never_fit_gets_400_naming_the_limit(zoo):
    """A long prompt beyond --kv-cache-memory-gib is refused up front (never admitted, nothing allocated):
    the prompt limit itself comes from the KV budget (issue 24, item 1), a text far beyond it is refused before
    it is tokenized, and a prompt that fits but whose max_tokens would not is refused too."""
    proc = ServerProcess(
        "--model", zoo.path("llama"), "--device", "cpu", "--threads", "1", "--served-model-name", "tiny",
        "--max-model-len", "2048", "--kv-cache-memory-gib", "0.0001",  # ~100 KiB: a few hundred tokens
    ).start()
    try:
        with httpx.Client(base_url=proc.base_url, timeout=60) as client:
            for prompt, words in [("word " * 300, "characters"), ("word " * 30, "tokens")]:  # 1 token per char
                r = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 8})
                assert r.status_code == 400
                message = r.json()["error"]["message"]
                assert words in message and "--kv-cache-memory-gib" in message, message
            r = client.post("/v1/completions", json={"model": "tiny", "prompt": "word " * 20, "max_tokens": 1000})
            assert r.status_code == 400 and "kv_cache_memory_bytes" in r.json()["error"]["message"]
            ok = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4})
            assert ok.status_code == 200
    finally:
        proc.stop()
