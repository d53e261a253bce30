"""`specdec train medusa|mtp` end to end on a tiny target: data directory in, drafter directory out, which
`specdec bench` then runs; both trainings share one feature cache with EAGLE-3's default layers."""

from __future__ import annotations

import json

import pytest
from specdec.cli import main

from eagle3_helpers import greedy_samples, write_data_dir


@pytest.fixture(scope="module")
def data_dir(zoo, tmp_path_factory):
    return write_data_dir(tmp_path_factory.mktemp("distill"), greedy_samples(zoo.load("bigram"), 24))


def test_train_then_bench(zoo, data_dir, tmp_path, capsys):
    cache = tmp_path / "feature-cache"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat sat on the mat"}) + "\n")
    for method, extra in (("medusa", ["--num-heads", "3"]), ("mtp", ["--steps", "2"])):
        out = tmp_path / method
        rc = main(["train", method, "--target", zoo.path("bigram"), "--data", str(data_dir), "--output", str(out),
                   "--max-steps", "4", "--tokens-per-step", "256", "--draft-vocab-size", "64",
                   "--feature-cache", str(cache), "--val-fraction", "0.1", "--checkpoint-every", "2", *extra])
        assert rc == 0
        assert json.loads(capsys.readouterr().out)["steps"] == 4
        config = json.loads((out / "config.json").read_text())
        assert config["speculators_model_type"] == method and config["draft_vocab_size"] == 64
        if method == "medusa":
            cached = sorted(p.name for p in cache.iterdir())
        else:  # the same layers (EAGLE-3's defaults) and ids: the same cache files, none recomputed
            assert sorted(p.name for p in cache.iterdir()) == cached
        rc = main(["bench", "--prompts", str(prompts), "--model", zoo.path("bigram"), "--max-new-tokens", "8",
                   "--warmup", "0", "--no-progress",
                   "--speculative-config", json.dumps({"method": method, "model": str(out)})])
        assert rc == 0
        overall = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert overall["identical"] == overall["prompts"] == 1
