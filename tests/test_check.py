"""`specdec check`, the lossless regression gate: passes on an exact engine, fails (exit 1) on a verification
bug (greedy or sampling) or below the acceptance floor, exit 2 on a user error; and the shipped case set
(enough cases of every kind, none from the eval sets or the held-out benchmarks)."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from specdec.check import sampling
from specdec.check.cases import CASES_PATH, KINDS, LONG_KIND, load_cases
from specdec.cli import main
from specdec.engine import step
from specdec.training.prompt_sources import DEFAULT_DATA_DIR, TrainPrompt
from specdec.verification import verify_draft
from specdec.verification.probabilities import sample
from specdec.verification.result import Verification

from test_prompt_sources import PROMPTS_DIR, _leaks

EVAL_DIR = DEFAULT_DATA_DIR.parent / "eval"
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'
# Short prompts for the tiny byte-level models; the first one holds most bytes, so lookup drafts after
# nearly any sampled byte (the sampling check picks it: "code" is a preferred kind).
TINY_CASES = [
    ("code", "the quick brown fox jumps over the lazy dog, THE QUICK BROWN FOX 0123456789"),
    ("chat", "one two three one two three"),
    ("math", "What is 2 + 2 + 2 + 2?"),
    ("qa", "Who wrote the the the?"),
]


@pytest.fixture
def cases_file(tmp_path):
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps({"id": f"c{i}", "kind": k, "turns": [t]}) + "\n"
                            for i, (k, t) in enumerate(TINY_CASES)))
    return path


def _check(zoo, cases_file, tmp_path, *extra: str, model: str = "bigram") -> tuple[int, dict]:
    out = tmp_path / "report.json"
    rc = main(["check", "--model", zoo.path(model), "--cases", str(cases_file), "--max-new-tokens", "16",
               "--sampling-cases", "1", "--samples", "64", "--sampling-tokens", "6", "--no-progress",
               "--output-json", str(out), "--output-md", str(tmp_path / "report.md"), *extra])
    return rc, json.loads(out.read_text())


def test_the_default_config_is_ngram_with_auto_length():
    from specdec.check.settings import CheckSettings

    assert [dict(c) for c in CheckSettings().configs] == [{"method": "ngram", "num_speculative_tokens": "auto"}]


def test_an_exact_engine_passes(zoo, cases_file, tmp_path, capsys):
    # a fixed length: "auto" (the default config) prices rows from timings, and on a tiny model under load
    # it may rightly draft nothing, which the acceptance floor would then fail
    rc, report = _check(zoo, cases_file, tmp_path, "--speculative-config", NGRAM)
    assert rc == 0 and report["passed"] and not report["failures"]
    (run,) = report["runs"]
    assert run["config"]["num_speculative_tokens"] == 3
    assert run["identical"] == len(TINY_CASES) and not run["divergences"]
    assert run["acceptance_rate"] >= 0.3 and run["sampling"]["p_value"] >= 1e-3
    assert "PASSED" in (tmp_path / "report.md").read_text() and "PASSED" in capsys.readouterr().out


def test_a_draft_kept_without_verification_fails_at_its_first_difference(zoo, cases_file, tmp_path, capsys,
                                                                       monkeypatch):
    real = step.verify

    def keep_every_draft(tokens, parents, draft_probs, target, params, generator):
        outcome = real(tokens, parents, draft_probs, target, params, generator)
        return Verification(len(tokens), outcome.next_token)

    monkeypatch.setattr(step, "verify", keep_every_draft)
    rc, report = _check(zoo, cases_file, tmp_path, "--speculative-config", NGRAM, "--sampling-cases", "0")
    assert rc == 1 and not report["passed"]
    found = report["runs"][0]["divergences"]
    assert found
    for d in found:
        assert d["baseline_token"] != d["speculative_token"] and d["position"] >= 0
        assert d["logit_margin"] >= 0 and isinstance(d["context"], str)
    first = found[0]
    out = capsys.readouterr().out
    assert f"{first['id']} ({first['kind']}): first difference at token {first['position']}" in out
    assert re.search(r"greedy divergence in c\d \(\w+\) at position \d+", " ".join(report["failures"]))


def test_sampling_that_skips_verification_fails_the_chi_square(zoo, cases_file, tmp_path, monkeypatch):
    # greedy verification stays exact: only the sampling check can catch this
    monkeypatch.setattr(verify_draft, "verify_tree_sampling", lambda tokens, parents, draft_probs, probs, generator:
                        Verification(len(tokens), sample(probs[len(tokens)], generator)))
    rc, report = _check(zoo, cases_file, tmp_path, "--speculative-config", NGRAM)
    (run,) = report["runs"]
    assert rc == 1 and run["identical"] == len(TINY_CASES)
    assert run["sampling"]["drafted_tokens"] > 0 and run["sampling"]["p_value"] < 1e-3
    assert any("sampling check: chi-square" in f for f in run["failures"])


def test_the_acceptance_floor_trips(zoo, cases_file, tmp_path):
    rc, report = _check(zoo, cases_file, tmp_path, "--speculative-config", NGRAM, "--sampling-cases", "0",
                        "--min-acceptance", "1")
    (run,) = report["runs"]
    assert rc == 1 and run["identical"] == len(TINY_CASES) and run["acceptance_rate"] < 1
    assert run["failures"] == [f"acceptance rate {run['acceptance_rate']:.3f} < --min-acceptance 1.0"]


@pytest.mark.parametrize("args", [["--speculative-config", "{oops"], ["--batch-size", "0"],
                                  ["--min-acceptance", "2"], ["--speculative-config", "[]"],
                                  ["--cases", "missing.jsonl"], ["--kinds", "poetry"]])
def test_user_errors_exit_2(zoo, cases_file, args, capsys):
    cases = [] if "--cases" in args else ["--cases", str(cases_file)]
    assert main(["check", "--model", zoo.path("bigram"), *cases, "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ") and "Traceback" not in err


def test_the_chi_square_tail_is_scipys():
    from scipy import stats

    for statistic, df in [(3.0, 1), (12.5, 7), (150.0, 120), (0.0, 4)]:
        assert sampling.chi_square_sf(statistic, df) == pytest.approx(stats.chi2.sf(statistic, df), rel=1e-6)


def test_the_shipped_set_covers_every_kind():
    cases = load_cases()
    assert len(cases) >= 64 and len({c.id for c in cases}) == len(cases)
    assert {c.kind for c in cases} == set(KINDS)
    assert all(sum(c.kind == k for c in cases) >= 4 for k in KINDS)
    long = [c for c in cases if c.kind == LONG_KIND]
    assert all(len(" ".join(c.turns + c.answers).split()) >= 500 for c in long)  # 1k-2.5k Gemma tokens
    with gzip.open(CASES_PATH, "rt", encoding="utf-8") as f:  # the bench's schema, multi-turn cases included
        assert any(len(json.loads(line)["turns"]) > 1 for line in f)


def _eval_texts() -> list[str]:
    texts = []
    for name in ("mt_bench/question.jsonl", "alpaca/question.jsonl"):
        texts += [t for line in (EVAL_DIR / name).read_text().splitlines() if line.strip()
                  for t in json.loads(line)["turns"]]
    texts += [json.loads(line)["question"] for line in (EVAL_DIR / "gsm8k/test.jsonl").read_text().splitlines()
              if line.strip()]
    with gzip.open(EVAL_DIR / "human_eval/HumanEval.jsonl.gz", "rt") as f:
        texts += [json.loads(line)["prompt"] for line in f if line.strip()]
    return texts


@pytest.mark.skipif(not EVAL_DIR.is_dir(), reason="../shared/data/eval not present")
def test_no_shipped_case_comes_from_the_eval_sets_or_the_held_out_benchmarks():
    cases = load_cases()
    norm = lambda text: re.sub(r"\s+", " ", text).strip()  # noqa: E731
    haystack = "\x00".join(norm(t) for c in cases for t in c.turns + c.answers)
    texts = [norm(t) for t in _eval_texts()]
    assert len(texts) > 1400
    assert not [t for t in texts if len(t) >= 20 and t in haystack]
    held = json.loads((PROMPTS_DIR / "held_out.exclude.json").read_text())
    assert not _leaks([TrainPrompt(c.id, c.kind, c.turns, c.answers) for c in cases], held)
