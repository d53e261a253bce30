"""Server pieces without a server: streaming text hold-back, the sliding window and its gauges, chat
templates, request parsing, and the commands' argument errors."""

from __future__ import annotations

import math

import pytest

from specdec.serving.chat_template import PLAIN_STOP, render_chat, render_plain
from specdec.serving.errors import APIError
from specdec.serving.metrics import ServerMetrics, SlidingWindow
from specdec.serving.schemas import ChatCompletionRequest, CompletionRequest, Limits, parse_request
from specdec.serving.text_stream import TextDeltas

LIMITS = Limits(max_model_len=100, max_prompt_tokens=80, max_tokens_limit=60, vocab_size=272)


# ---- streaming text ----

def test_deltas_concatenate_to_the_final_text():
    d = TextDeltas()
    texts = ["He", "Hello", "Hello, w", "Hello, world"]
    deltas = [d.update(t, len(t), i == len(texts) - 1) for i, t in enumerate(texts)]
    assert deltas == ["He", "llo", ", w", "orld"]


def test_a_possible_stop_string_prefix_is_held_back():
    # stop "\nUser:" (6 chars): the last 5 characters wait until the request ends
    d = TextDeltas(PLAIN_STOP)
    assert d.update("Hi there", 8, False) == "Hi "
    assert d.update("Hi there\nUs", 11, False) == "the"  # "\nUs" is not sent
    assert d.update("Hi there\nUser:", 8, True) == "re"  # the output ends before the stop string


# ---- metrics ----

class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_sliding_window_forgets_old_steps():
    clock = FakeClock()
    w = SlidingWindow(10, clock)
    w.add(1, 1, 4, 4)
    clock.t += 5
    w.add(2, 2, 8, 2)
    assert w.totals() == (3, 3, 12, 6)
    clock.t += 7  # the first second is now more than 10 s old
    assert w.totals() == (2, 2, 8, 2)
    clock.t += 20
    assert w.totals() == (0, 0, 0, 0)


def test_window_gauges():
    m = ServerMetrics("m", num_speculative_tokens=4, window_seconds=60)
    assert math.isnan(m.window_acceptance_rate()) and math.isnan(m.window_efficiency())
    assert math.isnan(m.window_mean_acceptance_length())
    m.record_step(1, 1, 4, 3, [1, 1, 1])  # a draft of 4, 3 accepted: 4 tokens from one forward
    m.record_step(1, 0, 0, 0, [])  # an n-gram miss: 1 token
    assert m.window_acceptance_rate() == pytest.approx(3 / 4)
    assert m.window_efficiency() == pytest.approx((3 + 1) / (1 * 5))  # vLLM: drafting steps only
    assert m.window_mean_acceptance_length() == pytest.approx((3 + 2) / 2)  # every step
    text = m.render().decode()
    assert 'specdec:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="3"} 0.0' in text
    assert 'specdec:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 1.0' in text
    assert 'specdec:spec_decode_acceptance_rate{model_name="m"} 0.75' in text
    assert "_created" not in text


# ---- chat templates ----

def test_plain_template():
    messages = [{"role": "developer", "content": "Rules."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    assert render_plain(messages) == "System: Rules.\nUser: Hi\nAssistant: Hello!\nUser: Bye\nAssistant:"


def test_tokenizer_template_is_used_when_present():
    from tiny_models import make_tokenizer

    tok = make_tokenizer()
    messages = [{"role": "user", "content": "Hi"}]
    plain = render_chat(tok, messages)
    assert plain.template == "plain" and plain.stop == PLAIN_STOP
    assert plain.token_ids == list(tok(plain.prompt).input_ids) and plain.token_ids[0] == 1  # <bos>
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    chat = render_chat(tok, messages)
    assert chat.template == "tokenizer" and chat.stop == []
    assert chat.prompt == "<bos><|user|>Hi<|end|><|assistant|>"
    assert chat.token_ids.count(1) == 1  # the template's <bos> only: none added on top
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(APIError) as info:
        render_chat(tok, messages)
    assert info.value.status == 400 and "roles must alternate" in info.value.message


# ---- request parsing ----

def test_defaults_follow_openai():
    req = parse_request(CompletionRequest, {"model": "m", "prompt": "x"})
    p = req.sampling_params(LIMITS, 5, 16)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed, p.stop) == (1.0, 1.0, 0, 16, None, [])
    chat = parse_request(ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert chat.sampling_params(LIMITS, 70, None, PLAIN_STOP).max_tokens == 30  # as many as fit, <= the limit
    assert chat.sampling_params(LIMITS, 5, None).max_tokens == 60


def test_template_stop_is_added_to_the_requests_own():
    chat = parse_request(ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                 "stop": "END"})
    assert chat.sampling_params(LIMITS, 5, None, PLAIN_STOP).stop == ["END", *PLAIN_STOP]


def test_token_prompt_forms():
    def ids(prompt):
        return parse_request(CompletionRequest, {"model": "m", "prompt": prompt}).prompt_input()

    assert ids("a") == "a" and ids(["a"]) == "a" and ids([1, 2]) == [1, 2] and ids([[1, 2]]) == [1, 2]
    for bad in ([], [1.5], [[1], [2]], {"a": 1}, [True]):
        with pytest.raises(APIError):
            ids(bad)


# ---- commands ----

def test_serve_rejects_bad_limits_before_loading_anything(capsys):
    from specdec.cli import main

    assert main(["serve", "--model", "/nonexistent", "--max-num-seqs", "0", "--max-waiting", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--max-num-seqs must be >= 1" in err and "--max-waiting must be >= 0" in err


def test_bench_serve_without_a_server_is_a_clear_error(tmp_path, capsys):
    from serve_helpers import free_port
    from specdec.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    port = free_port()
    rc = main(["bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--prompts", str(prompts)])
    assert rc == 2 and "no OpenAI server" in capsys.readouterr().err


def test_plain_bench_still_parses():
    from specdec.cli import build_parser

    args = build_parser().parse_args(["bench", "--prompts", "x.jsonl", "--limit", "2"])
    assert args.command == "bench" and args.prompts == "x.jsonl"
