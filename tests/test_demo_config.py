"""The demo's speculative_config: where the bf16 linears run on AMX tiles the default model's hybrid drafts 15
lookup tokens with EAGLE-3's tree as its fallback, elsewhere 7 with its chain; other models run prompt lookup
alone."""

from __future__ import annotations

import pytest

from specdec.defaults import DEFAULT_MODEL
from specdec.demo import AMX_CONFIG, DEFAULT_MODEL_CONFIG, NGRAM_CONFIG, demo_config
from specdec.models import fast_linear
from specdec.speculative_config import SpeculativeConfig


@pytest.mark.parametrize("isa", ["amx", "avx512_bf16", "avx2", None])
def test_the_config_follows_the_kernels(monkeypatch, isa: str | None) -> None:
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: isa)
    config = demo_config(DEFAULT_MODEL)
    assert config is (AMX_CONFIG if isa == "amx" else DEFAULT_MODEL_CONFIG)
    lookup, fallback = config["num_speculative_tokens"], config["fallback"]
    assert (lookup, "tree_top_k" in fallback) == ((15, True) if isa == "amx" else (7, False))
    SpeculativeConfig.from_dict(config)  # a valid config


def test_a_target_on_a_gpu_gets_the_portable_config(monkeypatch) -> None:
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "amx")
    assert demo_config(DEFAULT_MODEL, "cuda") is DEFAULT_MODEL_CONFIG
    assert demo_config(DEFAULT_MODEL, "cpu") is AMX_CONFIG


def test_other_models_get_lookup_alone() -> None:
    assert demo_config("some/other-model") is NGRAM_CONFIG
