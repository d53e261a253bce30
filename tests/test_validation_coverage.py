"""The held-out report gives the draft vocabulary's coverage of the held-out responses and the per-step
accuracy with out-of-vocabulary labels counted as misses, so drafters with different vocabularies compare."""

from __future__ import annotations

import json

import pytest
from specdec.cli import main

from eagle3_helpers import greedy_samples, write_data_dir


@pytest.mark.parametrize("method", ["eagle3", "medusa"])
def test_report_counts_out_of_vocabulary_labels_as_misses(zoo, tmp_path, capsys, method):
    target = zoo.load("bigram")
    data = write_data_dir(tmp_path / "data", greedy_samples(target, 10))
    rc = main(["train", method, "--target", zoo.path("bigram"), "--data", str(data), "--output",
               str(tmp_path / "out"), "--draft-vocab-size", "12", "--max-steps", "1", "--tokens-per-step", "128",
               "--val-fraction", "0.3"])
    assert rc == 0
    capsys.readouterr()
    val = json.loads((tmp_path / "out" / "training_report.json").read_text())["validation"]
    assert 0 < val["draft_vocab_coverage"] < 1  # 12 tokens cannot cover the bigram model's responses
    assert len(val["step_accuracy_counting_oov"]) == len(val["step_accuracy"])
    for skipped, counted in zip(val["step_accuracy"], val["step_accuracy_counting_oov"]):
        assert counted == pytest.approx(skipped * val["draft_vocab_coverage"], abs=1e-4)
