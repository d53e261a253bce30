"""`specdec quality`'s parts: chunked teacher-forced scoring equals one forward over the whole text, and the
held-out articles are exactly those the exclusion lists hold out."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specdec.quality import perplexity
from specdec.quality.held_out_text import held_out_articles
from specdec.quality.perplexity import score_text, summarize


def test_chunked_scores_equal_one_forward(zoo, monkeypatch):
    loaded = zoo.load("llama")
    ids = [(7 * i + 3) % 200 + 5 for i in range(41)]
    runtime = loaded.new_runtime()
    runtime.reset(len(ids) + 1)
    logp = torch.log_softmax(runtime.forward(ids[:-1]).logits.float(), dim=-1)
    runtime.release()
    monkeypatch.setattr(perplexity, "CHUNK", 16)  # three chunks through the KV cache
    scores = score_text(loaded.new_runtime(), ids)
    expected = (-logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]).tolist()
    assert scores.nll == pytest.approx(expected, abs=1e-5)
    assert scores.top1 == logp.argmax(-1).tolist()
    result = summarize([scores], [scores])
    assert result["tokens"] == 40 and result["top1_agreement"] == 1.0
    assert result["perplexity"] == pytest.approx(math.exp(sum(expected) / 40), rel=1e-5)
    other = summarize([scores], [perplexity.TextScores(scores.nll, [t + 1 for t in scores.top1])])
    assert other["top1_agreement"] == 0.0


def test_held_out_articles_are_the_excluded_ones(tmp_path):
    from specdec.training.prompt_sources import DEFAULT_EXCLUDE, Exclusions

    held = sorted(Exclusions.load_all(DEFAULT_EXCLUDE).wikitext_ids)
    (tmp_path / "wikitext2").mkdir()
    lines = [{"id": "train-only", "title": "t", "text": "never scored"},
             {"id": held[0], "title": "a", "text": "one <unk> word"}]
    (tmp_path / "wikitext2" / "articles.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    articles = held_out_articles(tmp_path)
    assert [a["id"] for a in articles] == [held[0]]
    assert "<unk>" not in articles[0]["text"]
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        held_out_articles(tmp_path / "nowhere")
