"""`specdec serve` as a real process on localhost, driven by the official `openai` client (and raw HTTP for
what the client hides): completions, chat, streaming, usage, per-response speculative figures, /metrics
counters equal to their sums, concurrency, sampling, stops, every bad input a 4xx, and the load test."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

openai = pytest.importorskip("openai")

from serve_helpers import ServerProcess, scrape  # noqa: E402
from specdec import LLM, SamplingParams  # noqa: E402
from specdec.serving.chat_template import PLAIN_STOP, render_plain  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
MAX_MODEL_LEN = 1024
PROMPTS = [
    "the cat sat on the mat, the cat sat on the",
    "hello hello hello hello",
    "Question: What is 2+2?\nAnswer:",
    "abcabcabcabc",
]
SPEC_KEYS = ("num_steps", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position")


@pytest.fixture(scope="module")
def server(zoo):
    proc = ServerProcess(
        "--model", zoo.path("bigram"), "--device", "cpu", "--threads", "1", "--speculative-config", json.dumps(NGRAM),
        "--served-model-name", "tiny", "--max-model-len", str(MAX_MODEL_LEN), "--max-tokens-limit", "512",
        "--max-num-seqs", "2", "--max-waiting", "16",
    ).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference(zoo):
    """What `specdec generate` runs: the engine in this process, same model and config."""
    return LLM(loaded=zoo.load("bigram"), speculative_config=NGRAM, max_model_len=MAX_MODEL_LEN)


def _figures(obj) -> dict:
    spec = obj.model_extra["spec_decoding"] if hasattr(obj, "model_extra") else obj["spec_decoding"]
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 4
    return spec


def _expected(reference, prompt, params):
    out = reference.generate(prompt, params)[0]
    return out, out.outputs[0]


def test_models_health_version(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    card = client.models.retrieve("tiny")
    assert card.model_extra["max_model_len"] == MAX_MODEL_LEN
    assert card.model_extra["speculative_config"]["method"] == "ngram"
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    from specdec import __version__

    assert httpx.get(server.base_url + "/version").json() == {"version": __version__}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_equals_the_engine(client, reference, prompt):
    params = SamplingParams(temperature=0, max_tokens=48)
    expected, choice = _expected(reference, prompt, params)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=48, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text == choice.text
    assert r.choices[0].finish_reason == choice.finish_reason
    assert r.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert r.usage.completion_tokens == len(choice.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    spec = _figures(r)
    stats = expected.spec_decoding_stats
    for key in SPEC_KEYS:
        assert spec[key] == getattr(stats, key), key
    assert spec["draft_n"] == spec["num_draft_tokens"] and spec["draft_n_accepted"] == spec["num_accepted_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(stats.mean_acceptance_length, abs=1e-5)


def test_token_id_prompt(client, reference):
    ids = list(reference.tokenizer(PROMPTS[0]).input_ids)
    by_text = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=16, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_chat_uses_the_plain_template(client, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello hello."}]
    prompt = render_plain(messages)
    assert prompt == "System: Be brief.\nUser: Say hello hello.\nAssistant:"
    _, choice = _expected(reference, prompt, SamplingParams(temperature=0, max_tokens=40, stop=PLAIN_STOP))
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == choice.text
    assert r.choices[0].finish_reason == choice.finish_reason
    _figures(r)
    # text parts are joined; max_completion_tokens is the newer spelling of max_tokens
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
             messages[1]]
    r2 = client.chat.completions.create(model="tiny", messages=parts, max_completion_tokens=40, temperature=0)
    assert r2.choices[0].message.content == choice.text


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streaming_equals_non_streaming(client, kind):
    if kind == "chat":
        kwargs = dict(messages=[{"role": "user", "content": PROMPTS[1]}])
        create = client.chat.completions.create
    else:
        kwargs = dict(prompt=PROMPTS[2])
        create = client.completions.create
    full = create(model="tiny", max_tokens=60, temperature=0, **kwargs)
    chunks = list(create(model="tiny", max_tokens=60, temperature=0, stream=True,
                         stream_options={"include_usage": True}, **kwargs))
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == full.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == full.usage.prompt_tokens
    body = chunks[:-1]
    assert all(c.usage is None for c in body)
    if kind == "chat":
        assert body[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in body)
        assert text == full.choices[0].message.content
    else:
        text = "".join(c.choices[0].text for c in body)
        assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in body][-1] == full.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in body[:-1])
    assert _figures(body[-1]) == _figures(full) == _figures(usage_chunk)
    # without include_usage: no usage chunk, still the figures on the last chunk
    plain = list(create(model="tiny", max_tokens=60, temperature=0, stream=True, **kwargs))
    assert plain[-1].choices and plain[-1].choices[0].finish_reason and plain[-1].usage is None
    assert _figures(plain[-1]) == _figures(full)


def test_raw_sse_format(server):
    with httpx.stream("POST", server.base_url + "/v1/completions", json={
        "model": "tiny", "prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0, "stream": True,
    }, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        assert json.loads(e[len("data: "):])["object"] == "text_completion"


def test_sampling_with_seed_is_reproducible_and_equals_the_engine(client, reference):
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=32, seed=1234)
    _, choice = _expected(reference, PROMPTS[2], params)
    kwargs = dict(model="tiny", prompt=PROMPTS[2], max_tokens=32, temperature=0.9, top_p=0.9, seed=1234,
                  extra_body={"top_k": 50})
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert a.choices[0].text == b.choices[0].text == choice.text


def test_stop_strings(client, reference):
    full = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=48, temperature=0).choices[0].text
    stop = next(full[i : i + 3] for i in range(3, len(full)) if "\ufffd" not in full[i : i + 3])
    expected = full[: full.index(stop)]
    assert expected
    r = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=48, temperature=0, stop=[stop])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop
    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=48, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected


def test_metrics_counters_equal_the_sums_of_the_responses(server, client):
    before = scrape(server.base_url)
    responses = [client.completions.create(model="tiny", prompt=p, max_tokens=64, temperature=0) for p in PROMPTS]
    responses.append(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPTS[3]}], max_tokens=64, temperature=0))
    stream = list(client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=64, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    figures = [_figures(r) for r in responses] + [_figures(stream[-1])]
    usages = [r.usage for r in responses] + [stream[-1].usage]
    after = scrape(server.base_url)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta("specdec:spec_decode_num_drafts_total") == sum(f["num_drafts"] for f in figures)
    assert delta("specdec:spec_decode_num_draft_tokens_total") == sum(f["num_draft_tokens"] for f in figures)
    accepted = sum(f["num_accepted_tokens"] for f in figures)
    assert accepted > 0  # the bigram model cycles: n-gram drafts get accepted
    assert delta("specdec:spec_decode_num_accepted_tokens_total") == accepted
    for pos in range(4):
        expected = sum(f["accepted_per_position"][pos] for f in figures if len(f["accepted_per_position"]) > pos)
        assert delta(f"specdec:spec_decode_num_accepted_tokens_per_pos_total{{position={pos}}}") == expected
    assert delta("specdec:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta("specdec:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    finished = sum(delta(f"specdec:request_success_total{{finished_reason={r}}}") for r in ("stop", "length"))
    assert finished == len(figures)
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert delta(f"specdec:{hist}_count") == len(figures)
    itl = delta("specdec:inter_token_latency_seconds_count")
    assert itl == sum(u.completion_tokens for u in usages) - len(figures)
    rate = after["specdec:spec_decode_acceptance_rate"]
    assert 0 < rate <= 1
    k = 4
    drafts_w = after["specdec:spec_decode_num_drafts_total"]  # window >= test duration: all steps are in it
    assert after["specdec:spec_decode_efficiency"] == pytest.approx(
        (after["specdec:spec_decode_num_accepted_tokens_total"] + drafts_w) / (drafts_w * (k + 1)), rel=1e-9)
    assert after["specdec:num_requests_running"] == 0 and after["specdec:num_requests_waiting"] == 0


def test_concurrent_requests_all_succeed_with_the_engines_output(server, reference):
    """10 at once against 2 running + 16 queued: queued, interleaved, each output exactly the engine's."""
    prompts = [f"{p} {i}" for i, p in enumerate(PROMPTS * 3)][:10]
    expected = [c.outputs[0].text for c in reference.generate(prompts, SamplingParams(temperature=0, max_tokens=40))]

    async def run():
        async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0) as c:
            async def one(i, p):
                if i % 2:
                    r = await c.completions.create(model="tiny", prompt=p, max_tokens=40, temperature=0)
                    return r.choices[0].text
                chunks = await c.completions.create(model="tiny", prompt=p, max_tokens=40, temperature=0, stream=True)
                return "".join([ch.choices[0].text async for ch in chunks])

            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    assert asyncio.run(run()) == expected


# ---- bad input: every case a 4xx with an OpenAI error body naming the problem ----

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK_C = {"model": "tiny", "prompt": "hi", "max_tokens": 4}
OK_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BAD_INPUTS = [
    # (id, path, body (dict, or raw bytes), status, words the message must contain)
    ("not-json", C, b"{oops", 400, "not valid JSON"),
    ("empty-body", C, b"", 400, "empty"),
    ("json-array", C, b"[1, 2]", 400, "JSON object"),
    ("invalid-utf8", C, b"\xff\xfe{}", 400, "not valid JSON"),
    ("missing-model", C, {"prompt": "hi"}, 400, "model is required"),
    ("unknown-model", C, {**OK_C, "model": "gpt-4"}, 404, "does not exist"),
    ("missing-prompt", C, {"model": "tiny"}, 400, "prompt is required"),
    ("prompt-null", C, {**OK_C, "prompt": None}, 400, "prompt is required"),
    ("prompt-number", C, {**OK_C, "prompt": 5}, 400, "prompt must be"),
    ("prompt-empty-list", C, {**OK_C, "prompt": []}, 400, "empty list"),
    ("prompt-batch", C, {**OK_C, "prompt": ["a", "b"]}, 400, "batched prompts"),
    ("prompt-ids-out-of-vocab", C, {**OK_C, "prompt": [1, 99999]}, 400, "token ids must be in"),
    ("prompt-ids-negative", C, {**OK_C, "prompt": [-1]}, 400, "token ids must be in"),
    ("prompt-too-long", C, {**OK_C, "prompt": "x" * 1100}, 400, "limit of 1023"),
    ("unknown-field", C, {**OK_C, "frobnicate": 1}, 400, "unknown field 'frobnicate'"),
    ("max-tokens-zero", C, {**OK_C, "max_tokens": 0}, 400, "max_tokens must be >= 1"),
    ("max-tokens-negative", C, {**OK_C, "max_tokens": -5}, 400, "max_tokens must be >= 1"),
    ("max-tokens-over-limit", C, {**OK_C, "max_tokens": 100000}, 400, "max_tokens must be <= 512"),
    ("max-tokens-string", C, {**OK_C, "max_tokens": "10"}, 400, "max_tokens"),
    ("max-tokens-float", C, {**OK_C, "max_tokens": 10.5}, 400, "max_tokens"),
    ("max-tokens-bool", C, {**OK_C, "max_tokens": True}, 400, "max_tokens"),
    ("context-overflow", C, {**OK_C, "prompt": "x" * 600, "max_tokens": 500}, 400, "maximum context length"),
    ("temperature-negative", C, {**OK_C, "temperature": -0.5}, 400, "temperature must be in [0, 2]"),
    ("temperature-too-high", C, {**OK_C, "temperature": 5}, 400, "temperature must be in [0, 2]"),
    ("temperature-string", C, {**OK_C, "temperature": "hot"}, 400, "temperature"),
    ("temperature-nan", C, b'{"model": "tiny", "prompt": "hi", "temperature": NaN}', 400, "temperature"),
    ("temperature-tiny", C, {**OK_C, "temperature": 1e-300}, 400, "0 (greedy) or at least 0.01"),
    ("prompt-lone-surrogate", C, b'{"model": "tiny", "prompt": "a\\ud800b"}', 400, "cannot be tokenized"),
    ("deeply-nested-json", C, b"[" * 100000 + b"]" * 100000, 400, "nested too deeply"),
    ("top-p-zero", C, {**OK_C, "top_p": 0}, 400, "top_p must be in (0, 1]"),
    ("top-p-above-one", C, {**OK_C, "top_p": 1.5}, 400, "top_p must be in (0, 1]"),
    ("top-k-negative", C, {**OK_C, "top_k": -3}, 400, "top_k"),
    ("top-k-float", C, {**OK_C, "top_k": 2.5}, 400, "top_k"),
    ("n-two", C, {**OK_C, "n": 2}, 400, "n must be 1"),
    ("best-of", C, {**OK_C, "best_of": 3}, 400, "best_of"),
    ("logprobs", C, {**OK_C, "logprobs": 5}, 400, "logprobs"),
    ("echo", C, {**OK_C, "echo": True}, 400, "echo"),
    ("suffix", C, {**OK_C, "suffix": "end"}, 400, "suffix"),
    ("presence-penalty", C, {**OK_C, "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("frequency-penalty", C, {**OK_C, "frequency_penalty": 1}, 400, "frequency_penalty"),
    ("logit-bias", C, {**OK_C, "logit_bias": {"5": 10}}, 400, "logit_bias"),
    ("stop-empty-string", C, {**OK_C, "stop": ""}, 400, "stop strings must not be empty"),
    ("stop-number", C, {**OK_C, "stop": 5}, 400, "stop must be"),
    ("stop-list-with-number", C, {**OK_C, "stop": ["a", 1]}, 400, "a list holding int"),
    ("stop-too-many", C, {**OK_C, "stop": [str(i) for i in range(20)]}, 400, "at most 16"),
    ("seed-string", C, {**OK_C, "seed": "x"}, 400, "seed"),
    ("seed-negative", C, {**OK_C, "seed": -1}, 400, "seed must be in"),
    ("seed-huge", C, {**OK_C, "seed": 2**70}, 400, "seed"),
    ("stream-string", C, {**OK_C, "stream": "yes"}, 400, "stream"),
    ("stream-options-without-stream", C, {**OK_C, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("stream-options-unknown-key", C, {**OK_C, "stream": True, "stream_options": {"foo": 1}}, 400, "unknown field"),
    ("stop-token-ids-out-of-vocab", C, {**OK_C, "stop_token_ids": [100000]}, 400, "stop_token_ids"),
    ("chat-missing-messages", CHAT, {"model": "tiny"}, 400, "messages is required"),
    ("chat-empty-messages", CHAT, {**OK_CHAT, "messages": []}, 400, "at least 1"),
    ("chat-messages-not-list", CHAT, {**OK_CHAT, "messages": "hi"}, 400, "messages"),
    ("chat-bad-role", CHAT, {**OK_CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("chat-tool-role", CHAT, {**OK_CHAT, "messages": [{"role": "tool", "content": "hi"}]}, 400, "messages[0].role"),
    ("chat-missing-role", CHAT, {**OK_CHAT, "messages": [{"content": "hi"}]}, 400, "messages[0].role is required"),
    ("chat-content-number", CHAT, {**OK_CHAT, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content must be"),
    ("chat-user-content-null", CHAT, {**OK_CHAT, "messages": [{"role": "user", "content": None}]}, 400,
     "messages[0].content is required"),
    ("chat-image-part", CHAT, {**OK_CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "'image_url' is not supported"),
    ("chat-message-extra-field", CHAT, {**OK_CHAT, "messages": [{"role": "user", "content": "hi", "x": 1}]}, 400,
     "unknown field 'messages[0].x'"),
    ("chat-lone-surrogate", CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}', 400,
     "messages cannot be tokenized"),
    ("chat-tools", CHAT, {**OK_CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("chat-tool-choice", CHAT, {**OK_CHAT, "tool_choice": "auto"}, 400, "tool_choice"),
    ("chat-json-mode", CHAT, {**OK_CHAT, "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("chat-logprobs", CHAT, {**OK_CHAT, "logprobs": True}, 400, "logprobs"),
    ("chat-n-three", CHAT, {**OK_CHAT, "n": 3}, 400, "n must be 1"),
    ("chat-max-tokens-disagree", CHAT, {**OK_CHAT, "max_tokens": 4, "max_completion_tokens": 8}, 400, "disagree"),
    ("chat-max-completion-tokens-zero", CHAT, {"model": "tiny", "messages": OK_CHAT["messages"],
                                               "max_completion_tokens": 0}, 400,
     "max_completion_tokens must be >= 1"),
]


@pytest.mark.parametrize("path,body,status,words", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_a_clear_4xx(server, path, body, status, words):
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body}
    r = httpx.post(server.base_url + path, timeout=30, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"], error["message"]
    assert error["type"] in ("invalid_request_error", "not_found_error")


def test_bad_routes_and_methods(server):
    r = httpx.get(server.base_url + "/v1/nothing")
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    r = httpx.get(server.base_url + "/v1/completions")
    assert r.status_code == 405 and "not allowed" in r.json()["error"]["message"]
    r = httpx.get(server.base_url + "/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(server.base_url + C, content=b"x" * (5 * 1024 * 1024), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_the_openai_client_sees_the_errors_and_the_server_survives(server, client):
    before = scrape(server.base_url)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hi", n=2)
    assert "n must be 1" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=3)
    r = client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3
    assert server.alive()
    after = scrape(server.base_url)
    for status, n in ((400, 2), (404, 1)):
        name = f"specdec:request_rejected_total{{status={status}}}"
        assert after[name] - before.get(name, 0) == n


# ---- the load test command ----

def test_bench_serve_command(server, tmp_path):
    from specdec.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out, table = tmp_path / "load.json", tmp_path / "load.txt"
    rc = main(["bench", "serve", "--base-url", server.base_url, "--prompts", str(prompts), "--num-prompts", "8",
               "--max-concurrency", "4", "--max-tokens", "24", "--output-json", str(out), "--output-table", str(table)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["completed"] == 8 and report["failed"] == 0
    assert report["model"] == "tiny" and report["speculative_config"]["method"] == "ngram"
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(report[key]) == {"mean", "median", "p90", "p95", "p99", "max"}
        assert report[key]["median"] is not None and report[key]["median"] > 0
    assert report["ttft_ms"]["max"] <= report["e2el_ms"]["max"]
    assert report["total_output_tokens"] > 0 and report["output_throughput"] > 0
    assert report["metrics_check"]["match"] is True
    assert report["spec_decoding"]["num_accepted_tokens"] > 0
    assert "Median TTFT (ms):" in table.read_text()
    assert len(report["per_request"]) == 8
