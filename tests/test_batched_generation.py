"""Batched self-distillation data: left-padded prompts through transformers' generate."""

from __future__ import annotations

import json

import pytest
from specdec.api import _eos_ids
from specdec.training import self_distill
from specdec.training.batched_generation import generate_batch, length_sorted_batches
from specdec.training.prompt_sources import TrainPrompt
from specdec.training.self_distill import DistillSettings, generate_data, read_samples

PROMPTS = [[5, 9, 13], [7, 3, 22, 41, 8, 17, 2, 30], [11], [4, 4, 4, 4, 9]]


def test_padding_does_not_change_greedy_responses(zoo):
    """Each prompt batched with longer ones (left padding, masked) gets the response it gets alone."""
    model = zoo.hf("llama")  # float32: batched and single rows agree to the last bit that matters for argmax
    alone = [generate_batch(model, [p], 12, [], 0)[0] for p in PROMPTS]
    together = generate_batch(model, PROMPTS, 12, [], 0)
    assert together == alone
    assert all(len(r) == 12 for r in together)


def test_responses_stop_after_the_first_eos(zoo):
    model = zoo.hf("llama")
    (full,) = generate_batch(model, [PROMPTS[1]], 12, [], 0)
    eos = full[4]
    (cut,) = generate_batch(model, [PROMPTS[1]], 12, [eos], 0)
    assert cut == full[: full.index(eos) + 1]


def test_length_sorted_batches_cover_everything_once():
    lengths = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10]
    batches = length_sorted_batches(lengths, batch_size=2, window=2)
    assert sorted(i for b in batches for i in b) == list(range(10))
    assert batches[:2] == [[1, 3], [0, 2]]  # the first window (items 0-3) comes first, shortest first
    with pytest.raises(ValueError):
        generate_batch(None, [[]], 4, [], 0)


def test_generate_data_batched_writes_and_resumes(zoo, tmp_path, monkeypatch):
    fake = [TrainPrompt(f"p{i}", "chat", (f"word {i} " * (1 + i % 3),)) for i in range(7)]
    monkeypatch.setattr(self_distill, "build_prompts", lambda *a, **k: list(fake))
    settings = DistillSettings(target=zoo.path("llama"), max_new_tokens=6)
    out = tmp_path / "data"
    generate_data(settings, out, num_prompts=4, batch_size=3, progress=False)
    assert [s.id for s in read_samples(out)] != [] and len(read_samples(out)) == 4
    generate_data(settings, out, batch_size=3, progress=False)  # resumes: the other three only
    samples = read_samples(out)
    assert sorted(s.id for s in samples) == [p.id for p in fake]
    eos = set(_eos_ids(zoo.load("llama")))
    for s in samples:
        assert 1 <= len(s.response_ids) <= 6
        assert len(s.response_ids) == 6 or s.response_ids[-1] in eos
    assert json.loads((out / "meta.json").read_text())["max_new_tokens"] == 6
    with pytest.raises(ValueError, match="batch_size"):
        generate_data(settings, out, batch_size=0, progress=False)
