"""Bad input to the Python API and the CLI is a clear error naming the parameter (hardening issue, items 8-13):
never a TypeError or AttributeError from deep inside, a silent default, a truncated value, NaN probabilities
mid-generation, or a stack trace on the command line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from specdec import LLM, SamplingParams
from specdec import cli
from specdec.sampling_params import MIN_TEMPERATURE
from specdec.verification import sampling_probs

NGRAM_JSON = '{"method": "ngram", "num_speculative_tokens": 3}'
PROMPT_IDS = [1, 72, 101, 108, 108, 111]  # <bos> "Hello" in the tiny models' byte tokenizer


# --- item 8: SamplingParams numbers of the wrong type ------------------------------------------------------


def test_item8_temperature_none_names_parameter():
    with pytest.raises(ValueError, match="temperature must be a number, got None"):
        SamplingParams(temperature=None)


@pytest.mark.parametrize(
    "field, value",
    [
        *[("temperature", v) for v in ("0.5", True, math.inf, math.nan, [1.0])],
        *[("top_p", v) for v in (None, "0.5", True, math.inf, math.nan)],
        *[("top_k", v) for v in (None, "3", True, 2.0, math.nan)],
        *[("max_tokens", v) for v in (None, "8", True, 8.0, math.inf)],
        *[("seed", v) for v in ("7", True, 1.5, 2**64)],
        ("stop", 5),
        ("stop_token_ids", 5),
        ("stop_token_ids", "12"),
        ("ignore_eos", "no"),
    ],
)
def test_item8_wrong_types_are_value_errors_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must"):
        SamplingParams(**{field: value})


def test_item8_numpy_and_torch_numbers_become_python_numbers():
    p = SamplingParams(temperature=np.float32(0.5), top_p=np.float64(0.9), top_k=np.int64(3),
                       max_tokens=torch.tensor(4), seed=np.int32(1), stop_token_ids=np.array([2, 3]))
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed, p.stop_token_ids) == (0.5, 0.9, 3, 4, 1, [2, 3])
    assert [type(v) for v in (p.temperature, p.top_k, p.max_tokens, p.seed, *p.stop_token_ids)] == [float] + [int] * 5


# --- item 9: tiny temperatures ------------------------------------------------------------------------------


def test_item9_tiny_temperature_refused_naming_temperature():
    """1e-300 used to be accepted, then overflowed logits / temperature and failed inside multinomial."""
    for tiny in (1e-300, 1e-6, MIN_TEMPERATURE / 2):
        with pytest.raises(ValueError, match=rf"temperature must be 0 \(greedy\) or at least {MIN_TEMPERATURE}"):
            SamplingParams(temperature=tiny)
    with pytest.raises(ValueError, match="temperature"):
        sampling_probs(torch.zeros(1, 4), 1e-300)


def test_item9_smallest_temperature_gives_finite_probabilities():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 1e4  # far beyond any real model's
    probs = sampling_probs(logits, MIN_TEMPERATURE)
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(3))


@pytest.mark.parametrize("speculative_config", [None, NGRAM_JSON])
def test_item9_generates_at_the_smallest_temperature(zoo, speculative_config):
    llm = LLM(loaded=zoo.load("llama"), speculative_config=speculative_config)
    params = SamplingParams(temperature=MIN_TEMPERATURE, max_tokens=12, seed=0, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": PROMPT_IDS}, params)[0].outputs[0]
    assert len(out.token_ids) == 12 and all(0 <= t < llm.model.vocab_size for t in out.token_ids)


# --- item 10: LLM(max_model_len=0) and the other limits -------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, -5, 2.5, "100", True])
def test_item10_max_model_len_zero_is_refused_not_the_default(zoo, value):
    with pytest.raises(ValueError, match=r"max_model_len must be an int >= 2"):
        LLM(loaded=zoo.load("llama"), max_model_len=value)


def test_item10_max_model_len_none_is_the_models_own(zoo):
    assert LLM(loaded=zoo.load("llama"), max_model_len=None).max_model_len == 2048
    assert LLM(loaded=zoo.load("llama"), max_model_len=np.int64(64)).max_model_len == 64


@pytest.mark.parametrize(
    "name, value",
    [("max_num_seqs", 0), ("max_num_seqs", None), ("max_num_seqs", 2.5), ("max_num_batched_tokens", None),
     ("max_num_batched_tokens", 0), ("kv_cache_memory_bytes", 0), ("kv_cache_memory_bytes", 1e9),
     ("kv_cache_memory_bytes", None)],
)
def test_item10_other_limits_name_the_parameter(zoo, name, value):
    with pytest.raises(ValueError, match=rf"{name} must be an int >= \d+, got {value!r}"):
        LLM(loaded=zoo.load("llama"), **{name: value})


# --- item 11: speculative_config as JSON text -----------------------------------------------------------------


def test_item11_speculative_config_json_string_is_parsed(zoo):
    llm = LLM(loaded=zoo.load("bigram"), speculative_config=NGRAM_JSON)
    assert llm.speculative_config.method == "ngram" and llm.speculative_config.num_speculative_tokens == 3
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    assert len(llm.generate({"prompt_token_ids": PROMPT_IDS}, params)[0].outputs[0].token_ids) == 8


@pytest.mark.parametrize(
    "value, message",
    [
        ("{method: ngram}", "speculative_config is not valid JSON"),
        ('["ngram"]', "speculative_config must be a JSON object, got list"),
        (["ngram"], "speculative_config must be a dict, a JSON string or a SpeculativeConfig, got list"),
        (5, "speculative_config must be a dict, a JSON string or a SpeculativeConfig, got int"),
    ],
)
def test_item11_bad_speculative_config_names_parameter(zoo, value, message):
    with pytest.raises(ValueError, match=message):
        LLM(loaded=zoo.load("llama"), speculative_config=value)


# --- item 12: token ids that are not ints ---------------------------------------------------------------------


@pytest.mark.parametrize("ids", [[1.7, 2.0], [1, True], "1 2", [1, [2]], [1, -1], [1, 10**6]])
def test_item12_float_prompt_token_ids_are_refused_not_truncated(zoo, ids):
    llm = LLM(loaded=zoo.load("llama"))
    with pytest.raises(ValueError, match="prompt_token_ids must be"):
        llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=2))


@pytest.mark.parametrize("ids", [[2.0], [1.7], [False], [-3]])
def test_item12_float_stop_token_ids_are_refused(ids):
    with pytest.raises(ValueError, match="stop_token_ids must be ints >= 0"):
        SamplingParams(stop_token_ids=ids)


def test_item12_numpy_and_torch_token_ids_are_accepted(zoo):
    llm = LLM(loaded=zoo.load("llama"))
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": np.array(PROMPT_IDS)}, {"prompt_token_ids": torch.tensor(PROMPT_IDS)},
                         {"prompt_token_ids": PROMPT_IDS}], params)
    assert all(o.prompt_token_ids == PROMPT_IDS and type(o.prompt_token_ids[0]) is int for o in outs)
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids == outs[2].outputs[0].token_ids


def test_item12_sampling_params_list_of_the_wrong_type(zoo):
    llm = LLM(loaded=zoo.load("llama"))
    with pytest.raises(ValueError, match="sampling_params must be a SamplingParams or a list of them, got dict"):
        llm.generate(["a"], {"temperature": 0})


# --- item 13: the CLI reports every error in one line --------------------------------------------------------


def _fail_with(monkeypatch, exc: BaseException) -> None:
    def command(args):
        raise exc

    monkeypatch.setattr(cli, "cmd_generate", command)


@pytest.mark.parametrize(
    "exc, shown",
    [
        (FileNotFoundError(2, "No such file or directory", "p.jsonl"), "No such file or directory: 'p.jsonl'"),
        (PermissionError(13, "Permission denied", "out.json"), "Permission denied: 'out.json'"),
        (json.JSONDecodeError("Expecting value", "{oops", 1), "Expecting value"),
        (ValueError("max_tokens must be an int >= 1, got 0"), "max_tokens must be an int >= 1"),
    ],
)
def test_item13_cli_user_errors_are_one_line_and_exit_2(monkeypatch, capsys, exc, shown):
    monkeypatch.delenv("SPECDEC_DEBUG", raising=False)
    _fail_with(monkeypatch, exc)
    assert cli.main(["generate", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ") and shown in err and err.count("\n") == 1


def test_item13_cli_ctrl_c_exits_130_quietly(monkeypatch, capsys):
    monkeypatch.delenv("SPECDEC_DEBUG", raising=False)
    _fail_with(monkeypatch, KeyboardInterrupt())
    assert cli.main(["generate", "hi"]) == 130
    assert capsys.readouterr().err == ""


def test_item13_cli_internal_errors_exit_1_with_traceback_only_when_debugging(monkeypatch, capsys):
    monkeypatch.delenv("SPECDEC_DEBUG", raising=False)
    _fail_with(monkeypatch, RuntimeError("boom"))
    assert cli.main(["generate", "hi"]) == 1
    err = capsys.readouterr().err
    assert err == "specdec: internal error: RuntimeError: boom (set SPECDEC_DEBUG=1 for the traceback)\n"
    monkeypatch.setenv("SPECDEC_DEBUG", "1")
    assert cli.main(["generate", "hi"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("specdec: internal error: RuntimeError: boom\n")


def test_item13_cli_threads_zero_is_an_error_not_the_default(zoo, capsys):
    assert cli.main(["generate", "--model", zoo.path("llama"), "--threads", "0", "--max-tokens", "2", "hi"]) == 2
    assert capsys.readouterr().err == "specdec: error: --threads must be >= 1, got 0\n"


def test_item13_cli_bad_speculative_config_names_the_flag(zoo, capsys):
    argv = ["generate", "--model", zoo.path("llama"), "--speculative-config", "{oops", "--max-tokens", "2", "hi"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: --speculative-config is not valid JSON") and err.count("\n") == 1
