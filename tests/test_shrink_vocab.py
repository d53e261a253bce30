"""`specdec drafter shrink-vocab`: any learned drafter keeps its most frequent draft tokens, stays lossless."""

from __future__ import annotations

import json

import pytest
from specdec import LLM, SamplingParams
from specdec.cli import main
from specdec.drafting.dflash_format import load_dflash
from specdec.drafting.eagle3_format import load_eagle3
from specdec.drafting.medusa_format import load_medusa
from specdec.drafting.mtp_format import load_mtp

from eagle3_helpers import greedy_samples, make_random_eagle3, write_data_dir
from medusa_helpers import make_random_medusa
from mtp_helpers import make_random_mtp
from test_dflash import make_random_dflash

MAKERS = {"eagle3": (make_random_eagle3, load_eagle3), "medusa": (make_random_medusa, load_medusa),
          "mtp": (make_random_mtp, load_mtp), "dflash": (make_random_dflash, load_dflash)}
GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)


@pytest.mark.parametrize("method", sorted(MAKERS))
def test_shrunk_drafter_is_a_subset_and_stays_lossless(zoo, tmp_path, capsys, method):
    target = zoo.load("llama")
    make, load = MAKERS[method]
    source = make(target, tmp_path / "big", draft_vocab_size=200, seed=1)
    samples = greedy_samples(target, 6)
    write_data_dir(tmp_path / "data", samples)
    rc = main(["drafter", "shrink-vocab", source, "--data", str(tmp_path / "data"), "--draft-vocab-size", "40",
               "--output", str(tmp_path / "small")])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["old_draft_vocab_size"] == 200 and report["draft_vocab_size"] == 40
    assert report["coverage"] <= report["old_coverage"]
    big, _ = load(source, target)
    small, config = load(tmp_path / "small", target)
    assert config["draft_vocab_size"] == 40 and config["specdec"]["vocab_shrunk"]["draft_vocab_size"] == 40
    kept, old = set(small.draft_ids().tolist()), set(big.draft_ids().tolist())
    assert len(kept) == 40 and kept <= old
    seen = {t for s in samples for t in s.response_ids if t in old}
    assert kept <= seen or seen <= kept  # the responses' tokens come first
    for name, tensor in big.state_dict().items():
        if name not in ("d2t", "t2d"):
            assert (small.state_dict()[name] == tensor).all(), name
    plain = LLM(loaded=target)
    spec = LLM(loaded=target, speculative_config={"method": method, "model": str(tmp_path / "small")})
    for prompt in ["The quick brown fox", "def fibonacci(n):"]:
        assert spec.generate(prompt, GREEDY)[0].outputs[0].token_ids == plain.generate(prompt, GREEDY)[0].outputs[0].token_ids


def test_bad_requests_are_clear_errors(zoo, tmp_path, capsys):
    target = zoo.load("llama")
    source = make_random_eagle3(target, tmp_path / "big", draft_vocab_size=100)
    write_data_dir(tmp_path / "data", greedy_samples(target, 2))
    args = ["drafter", "shrink-vocab", source, "--data", str(tmp_path / "data")]
    for extra, message in [(["--draft-vocab-size", "100", "--output", str(tmp_path / "o")], "1..99"),
                           (["--draft-vocab-size", "10", "--output", source], "must differ")]:
        assert main([*args, *extra]) != 0
        assert message in capsys.readouterr().err
    assert main(["drafter", "shrink-vocab", str(tmp_path / "data"), "--data", str(tmp_path / "data"),
                 "--draft-vocab-size", "10", "--output", str(tmp_path / "o")]) != 0
    assert "not a drafter directory" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_medusa_own_projections_keep_the_kept_tokens_rows(zoo, tmp_path, capsys):
    target = zoo.load("llama")
    source = make_random_medusa(target, tmp_path / "big", draft_vocab_size=200, seed=1, own_lm_heads=True)
    write_data_dir(tmp_path / "data", greedy_samples(target, 6))
    assert main(["drafter", "shrink-vocab", source, "--data", str(tmp_path / "data"), "--draft-vocab-size", "40",
                 "--output", str(tmp_path / "small")]) == 0
    capsys.readouterr()
    big, _ = load_medusa(source, target)
    small, _ = load_medusa(tmp_path / "small", target)
    row = {t: i for i, t in enumerate(big.draft_ids().tolist())}
    kept = [row[t] for t in small.draft_ids().tolist()]
    for k in range(big.config.num_heads):
        assert (small.projection(k).weight == big.projection(k).weight[kept]).all()
    plain = LLM(loaded=target)
    spec = LLM(loaded=target, speculative_config={"method": "medusa", "model": str(tmp_path / "small")})
    assert spec.generate("The quick brown fox", GREEDY)[0].outputs[0].token_ids == \
        plain.generate("The quick brown fox", GREEDY)[0].outputs[0].token_ids
