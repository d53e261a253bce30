"""`data generate --batch-size N`: self-distillation through our batched engine, identical at any N."""

from __future__ import annotations

import json

import pytest
from specdec.api import _eos_ids
from specdec.training import self_distill
from specdec.training.prompt_sources import TrainPrompt
from specdec.training.self_distill import DistillSettings, generate_data, read_samples


def _fake_prompts(monkeypatch, n: int = 7) -> list[TrainPrompt]:
    fake = [TrainPrompt(f"p{i}", "chat", (f"word {i} " * (1 + i % 3),)) for i in range(n)]
    monkeypatch.setattr(self_distill, "build_prompts", lambda *a, **k: list(fake))
    return fake


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_samples_are_identical_at_any_batch_size(zoo, tmp_path, monkeypatch, temperature):
    """Each response is the one batch 1 gives (greedy: the target's plain output; sampled: its seed's draw),
    with n-gram drafts verified in the batch (the auto policy may draft or not; fixed K=3 always drafts)."""
    _fake_prompts(monkeypatch)
    responses = {}
    for batch_size, spec in [(1, '{"method": "ngram", "num_speculative_tokens": 3}'), (4, None), (7, None)]:
        settings = DistillSettings(target=zoo.path("gemma_untied"), max_new_tokens=10, temperature=temperature,
                                   **({"speculative_config": spec} if spec else {}))
        out = tmp_path / f"b{batch_size}"
        generate_data(settings, out, batch_size=batch_size, progress=False)
        responses[batch_size] = {s.id: s.response_ids for s in read_samples(out)}
    assert len(responses[1]) == 7
    assert responses[4] == responses[1] and responses[7] == responses[1]


def test_generate_data_batched_writes_and_resumes(zoo, tmp_path, monkeypatch):
    fake = _fake_prompts(monkeypatch)
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
