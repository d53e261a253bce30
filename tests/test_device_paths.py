"""Every device this machine has, named explicitly (`device=`): greedy speculative decoding equals plain
decoding there, and the learned drafters train there and are then accepted. CI runs the CPU; a machine with a
GPU runs the CUDA paths too (`pytest tests/test_device_paths.py`: torch with CUDA, the test dependencies and
`gguf`)."""

from __future__ import annotations

import pytest
import torch
from specdec.api import LLM
from specdec.models.loading import load_model
from specdec.sampling_params import SamplingParams
from specdec.training.train_dflash import DFlashTrainOptions, train_dflash
from specdec.training.train_eagle3 import Eagle3TrainOptions, train_eagle3
from specdec.training.trainer import TrainSettings

from eagle3_helpers import greedy_samples, make_random_eagle3
from test_dflash import make_random_dflash
from tiny_models import make_tiny_model

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PROMPTS = ["The quick brown fox", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module", params=DEVICES)
def targets(request, tmp_path_factory):
    """A tiny Gemma 3 (sliding and global layers) and a bigram target (greedy output a drafter can learn)."""
    root = tmp_path_factory.mktemp(f"{request.param}_targets")
    device = request.param
    loaded = {"gemma3": load_model(make_tiny_model(root / "g", family="gemma3_text"), device=device),
              "bigram": load_model(make_tiny_model(root / "b", num_layers=2, seed=3, bigram=True), device=device)}
    assert all(t.device.type == device for t in loaded.values())
    return loaded


def greedy(llm: LLM) -> list[list[int]]:
    return [list(llm.generate(p, GREEDY)[0].outputs[0].token_ids) for p in PROMPTS]


@pytest.mark.parametrize("method", ["ngram", "dflash", "eagle3"])
def test_greedy_speculative_output_equals_plain_on_the_device(targets, tmp_path, method):
    target = targets["gemma3"]
    config = {"ngram": {"method": "ngram", "num_speculative_tokens": 4},
              "dflash": {"method": "dflash", "model": make_random_dflash(target, tmp_path / "d", 200)},
              "eagle3": {"method": "eagle3", "model": make_random_eagle3(target, tmp_path / "e", 200),
                         "num_speculative_tokens": 4}}[method]
    assert greedy(LLM(loaded=target, speculative_config=config)) == greedy(LLM(loaded=target))


@pytest.mark.parametrize("method", ["dflash", "eagle3"])
def test_a_drafter_trained_on_the_device_is_accepted_and_lossless(targets, tmp_path, method):
    target = targets["bigram"]
    samples = greedy_samples(target, 64)
    settings = TrainSettings(max_steps=60, tokens_per_step=256, lr=1e-2, warmup_steps=5, val_fraction=0.1,
                             checkpoint_every=20)
    out = tmp_path / method
    if method == "dflash":
        options = DFlashTrainOptions(block_size=8, num_layers=2, draft_vocab_size=256, num_anchors=32)
        report = train_dflash(target, samples, out, settings, options, progress=False)
        config = {"method": "dflash", "model": str(out)}
    else:
        report = train_eagle3(target, samples, out, settings, Eagle3TrainOptions(draft_vocab_size=256, ttt_steps=2),
                              progress=False)
        config = {"method": "eagle3", "model": str(out), "num_speculative_tokens": 4}
    assert report["validation"]["step_accuracy"][0] > 0.3
    spec = LLM(loaded=target, speculative_config=config)
    assert greedy(spec) == greedy(LLM(loaded=target))
    assert spec.stats.num_accepted_tokens > 10  # drafts were proposed, verified and kept
