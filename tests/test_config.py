"""Validation of speculative_config and SamplingParams: every problem reported, with the valid choices."""

from __future__ import annotations

import re

import pytest

from specdec import SamplingParams, SpeculativeConfig
from specdec.drafting.draft_model import DraftModelOptions
from specdec.drafting.ngram import NgramOptions
from specdec.drafting.registry import available_methods, get_method

# --- SpeculativeConfig -------------------------------------------------------------------------------------


def test_ngram_config():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2})
    assert config.method == "ngram" and config.num_speculative_tokens == 3
    assert config.options == NgramOptions(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2)
    assert SpeculativeConfig.from_dict(config.to_dict()) == config


def test_defaults():
    config = SpeculativeConfig.from_dict({"method": "ngram"})
    assert config.options == NgramOptions()
    assert SpeculativeConfig.from_dict({"method": "draft_model", "model": "x"}).num_speculative_tokens == 5


def test_method_inferred_from_model_like_vllm():
    assert SpeculativeConfig.from_dict({"model": "ngram", "num_speculative_tokens": 2}) == SpeculativeConfig(
        "ngram", NgramOptions(num_speculative_tokens=2)
    )
    draft = SpeculativeConfig.from_dict({"model": "some/draft", "num_speculative_tokens": 2})
    assert draft.method == "draft_model" and draft.options == DraftModelOptions("some/draft", 2)


def test_from_json():
    assert SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 7}').num_speculative_tokens == 7
    with pytest.raises(ValueError, match="not valid JSON"):
        SpeculativeConfig.from_json("{method: ngram}")
    with pytest.raises(ValueError, match="JSON object"):
        SpeculativeConfig.from_json("[1, 2]")


def test_unknown_method_lists_the_methods():
    listed = ", ".join(available_methods())
    with pytest.raises(ValueError, match=rf"unknown speculative method 'lookahead'; available: {listed}"):
        SpeculativeConfig.from_dict({"method": "lookahead"})
    assert {"draft_model", "ngram", "eagle3"} <= set(available_methods())
    assert available_methods() == sorted(available_methods())
    assert get_method("ngram").Options is NgramOptions


def test_missing_method_lists_the_methods():
    listed = ", ".join(available_methods())
    with pytest.raises(ValueError, match=rf"needs 'method' \(one of: {listed}\)"):
        SpeculativeConfig.from_dict({"num_speculative_tokens": 3})


def test_unknown_key_lists_the_valid_keys():
    with pytest.raises(ValueError) as info:
        SpeculativeConfig.from_dict({"method": "draft_model", "model": "m", "draft_tensor_parallel_size": 1})
    message = str(info.value)
    assert "unknown key 'draft_tensor_parallel_size' for method 'draft_model'" in message
    assert "valid keys: method, model, num_speculative_tokens" in message


@pytest.mark.parametrize("value", ["3", 3.0, True, None, [3]])
def test_wrong_type(value):
    with pytest.raises(ValueError, match=re.escape(f"num_speculative_tokens must be int, got {value!r}")):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": value})


def test_wrong_type_for_a_string_option():
    with pytest.raises(ValueError, match="model must be str, got 3"):
        SpeculativeConfig.from_dict({"method": "draft_model", "model": 3})


@pytest.mark.parametrize(
    "config, message",
    [
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be in 1..63, got 0"),
        ({"method": "ngram", "num_speculative_tokens": 64}, "num_speculative_tokens must be in 1..63, got 64"),
        ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min must be >= 1"),
        ({"method": "ngram", "prompt_lookup_min": 5}, r"prompt_lookup_max \(4\) must be >= prompt_lookup_min \(5\)"),
        ({"method": "draft_model", "model": "self:two"}, "'self:N'"),
        ({"method": "draft_model"}, "method 'draft_model' needs 'model'"),
    ],
)
def test_bad_values(config, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(config)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError) as info:
        SpeculativeConfig.from_dict({"method": "ngram", "k": 1, "prompt_lookup_min": "1", "prompt_lookup_max": 1.5})
    message = str(info.value)
    assert "unknown key 'k'" in message and "prompt_lookup_min must be int" in message
    assert "prompt_lookup_max must be int" in message


def test_not_a_dict():
    with pytest.raises(ValueError, match="JSON object, got list"):
        SpeculativeConfig.from_dict(["ngram"])


# --- SamplingParams ----------------------------------------------------------------------------------------


def test_sampling_defaults_follow_vllm():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed, p.ignore_eos) == (1.0, 1.0, 0, 16, None, False)
    assert not p.greedy and SamplingParams(temperature=0).greedy


def test_sampling_normalization():
    p = SamplingParams(top_k=-1, stop="###", stop_token_ids=None)
    assert p.top_k == 0 and p.stop == ["###"] and p.stop_token_ids == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(temperature=float("nan")), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-2), "top_k must be an int >= 0"),
        (dict(top_k=2.5), "top_k must be an int >= 0"),
        (dict(max_tokens=0), "max_tokens must be an int >= 1"),
        (dict(max_tokens=3.0), "max_tokens must be an int >= 1"),
        (dict(seed="7"), "seed must be an int"),
        (dict(stop=[""]), "stop must be non-empty strings"),
        (dict(stop=["ok", 3]), "stop must be non-empty strings"),
    ],
)
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_all_sampling_problems_at_once():
    with pytest.raises(ValueError) as info:
        SamplingParams(temperature=-1, top_p=2, max_tokens=0)
    assert str(info.value).count(";") == 2
