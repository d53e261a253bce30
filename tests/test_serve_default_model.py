"""`specdec serve` on the real default model (Gemma 3 270M, a base model: the plain chat template) with
n-gram drafting: greedy outputs equal the engine's in this process, chat and streaming work through the
openai client, and a small load test succeeds with /metrics matching the responses. About 40 s on 2 cores."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from serve_helpers import ServerProcess  # noqa: E402
from specdec import LLM, SamplingParams  # noqa: E402
from specdec.serving.chat_template import PLAIN_STOP, render_plain  # noqa: E402

pytestmark = pytest.mark.slow

NGRAM = {"method": "ngram", "num_speculative_tokens": 5}
PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "List the days of the week: Monday, Tuesday,",
]


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--speculative-config", json.dumps(NGRAM), "--threads", "1", "--device", "cpu").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def llm():
    return LLM(speculative_config=NGRAM, device="cpu")


def test_greedy_outputs_equal_the_engine(client, llm):
    expected = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=32))
    for prompt, out in zip(PROMPTS, expected):
        r = client.completions.create(model="gemma-3-270m", prompt=prompt, max_tokens=32, temperature=0)
        assert r.choices[0].text == out.outputs[0].text
        assert r.usage.completion_tokens == len(out.outputs[0].token_ids)
        spec = r.model_extra["spec_decoding"]
        assert spec["num_accepted_tokens"] == out.spec_decoding_stats.num_accepted_tokens
        assert spec["num_draft_tokens"] == out.spec_decoding_stats.num_draft_tokens


def test_chat_streamed_on_a_base_model(client, llm):
    messages = [{"role": "user", "content": "Name three colours."}]
    expected = llm.generate(render_plain(messages), SamplingParams(temperature=0, max_tokens=24, stop=PLAIN_STOP))
    chunks = list(client.chat.completions.create(model="gemma-3-270m", messages=messages, max_tokens=24,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected[0].outputs[0].text
    assert chunks[-1].usage.completion_tokens == len(expected[0].outputs[0].token_ids)


def test_small_load(server, tmp_path):
    from specdec.cli import main

    out = tmp_path / "load.json"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    assert main(["bench", "serve", "--base-url", server.base_url, "--prompts", str(prompts), "--num-prompts", "8",
                 "--max-concurrency", "4", "--max-tokens", "16", "--output-json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["completed"] == 8 and report["failed"] == 0 and report["metrics_check"]["match"]
