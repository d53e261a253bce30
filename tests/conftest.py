"""Shared fixtures: tiny random models built once per session, and the import path for an uninstalled checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
try:
    import specdec  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(_HERE.parent / "src"))
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import pytest  # noqa: E402
import torch  # noqa: E402

from tiny_models import make_tiny_model  # noqa: E402

# The tiny models are far too small for intra-op threads to help, and on a shared 2-core machine OpenMP
# spinning makes every small op ~10x slower. Exactness tests that matter per thread count set it themselves.
torch.set_num_threads(int(os.environ.get("SPECDEC_TEST_THREADS", "1")))

try:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
except ImportError:  # pragma: no cover
    pass

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3_text"]
WINDOW = 8  # sliding window of the windowed tiny models

# name -> make_tiny_model keyword arguments
MODEL_SPECS: dict[str, dict] = {
    **{family: dict(family=family) for family in FAMILIES},
    # Qwen with use_sliding_window: full attention below max_window_layers, sliding above
    "qwen2_sliding": dict(
        family="qwen2",
        config_overrides=dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2),
    ),
    # wide enough (640 like Gemma 3 270M) that CPU GEMV and GEMM round bfloat16 differently
    "wide_llama": dict(
        family="llama", num_layers=2, config_overrides=dict(hidden_size=640, intermediate_size=2048, head_dim=160)
    ),
    # an unrelated drafter for the llama target: same tokenizer, other weights
    "llama_draft": dict(family="llama", num_layers=2, seed=1),
    # Gemma with tied embeddings (as the real one) just repeats its input token when random; untied, it
    # produces varied greedy output, which is what the end-to-end tests need
    "gemma_untied": dict(family="gemma3_text", config_overrides=dict(tie_word_embeddings=False)),
    # head dim 32: on the AMX build its attention runs on tiles and its cache stores the tile layout
    # (amx_qk_scores.cpp, amx_probs_values.cpp, kv_cache.py); the other tiny models' 16 dims stay on FMAs
    "gemma_dim32": dict(family="gemma3_text", config_overrides=dict(tie_word_embeddings=False, head_dim=32,
                                                                     query_pre_attn_scalar=32)),
    "gemma_draft": dict(family="gemma3_text", num_layers=2, seed=1, config_overrides=dict(tie_word_embeddings=False)),
    # next token depends on the current one only: greedy output cycles, n-gram lookup predicts it
    "bigram": dict(family="llama", num_layers=2, seed=3, bigram=True),
    # a different tokenizer (one extra special token)
    "other_vocab": dict(family="llama", num_layers=1, seed=4, extra_tokens=("<extra_0>",)),
    # 12-token vocabulary with flat-ish distributions, for distribution tests through the engine
    "small_vocab": dict(family="llama", num_layers=2, seed=5, vocab_size=12, init_std=0.1),
    "small_vocab_draft": dict(family="llama", num_layers=1, seed=6, vocab_size=12, init_std=0.1),
}


class Zoo:
    """Builds each tiny model folder once, and loads each (name, dtype) once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._paths: dict[str, str] = {}
        self._loaded: dict[tuple[str, str], object] = {}
        self._hf: dict[str, object] = {}

    def path(self, name: str) -> str:
        if name not in self._paths:
            self._paths[name] = make_tiny_model(self.root / name, **MODEL_SPECS[name])
        return self._paths[name]

    def load(self, name: str, dtype: str = "bfloat16"):
        from specdec.models.loading import load_model

        key = (name, dtype)
        if key not in self._loaded:
            self._loaded[key] = load_model(self.path(name), dtype=dtype, device="cpu")
        return self._loaded[key]

    def hf(self, name: str):
        """The transformers model in float32, the reference our decoder must match."""
        from transformers import AutoModelForCausalLM

        if name not in self._hf:
            model = AutoModelForCausalLM.from_pretrained(
                self.path(name), dtype=torch.float32, attn_implementation="eager"
            )
            self._hf[name] = model.eval()
        return self._hf[name]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("tiny_models"))
