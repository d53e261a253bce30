"""`specdec bench --plot DIR` (bench/plots.py) on synthetic reports of every shape the bench writes, and
`--from-report` without a run: which figures are written, the K-sweep grouping, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.bench.plots import (
    ACCEPTANCE_PNG, BATCH_PNG, SPEEDUP_PNG, SWEEP_PNG, config_label, k_sweeps, load_reports, runs_of, write_plots,
)
from specdec.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(config: dict, speedup: float = 2.0, tok_s: float = 60.0, rates=(0.8, 0.6, 0.4)) -> dict:
    overall = {"speedup": speedup, "speculative_tokens_per_second": tok_s, "baseline_tokens_per_second": 30.0,
               "acceptance_rate_per_position": list(rates), "mean_acceptance_length": 2.5}
    return {"model": "tiny", "max_new_tokens": 32, "temperature": 0.0, "speculative_config": config,
            "overall": overall,
            "per_category": {"writing": {"speedup": speedup * 1.1}, "math": {"speedup": speedup * 0.9}}}


def _ngram(k: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


SWEEP = {"runs": [_run(_ngram(k), tok_s=40.0 + k) for k in (1, 3, 5)] + [
    _run({"method": "eagle3", "model": "d", "num_speculative_tokens": 8, "confidence_threshold": 0.45})]}
BATCHED = {"model": "tiny", "num_prompts": 4, "max_new_tokens": 16, "batch_sizes": [1, 4],
           "rows": [{"mode": m, "batch_size": b, "output_tokens_per_second": 10.0 * b, "speedup": 1.0 if m == "plain"
                     else 1.5} for m in ("plain", "ngram") for b in (1, 4)]}


def _write(tmp_path: Path, name: str, report: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return path


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def test_every_figure_from_a_sweep_report(tmp_path):
    runs, batched = runs_of(SWEEP, "sweep.json")
    written = write_plots(runs, batched, tmp_path / "figs")
    assert set(written) == {ACCEPTANCE_PNG, SPEEDUP_PNG, SWEEP_PNG}
    for name in written:
        assert _is_png(tmp_path / "figs" / name)


def test_no_sweep_figure_without_a_k_sweep(tmp_path):
    runs, _ = runs_of(_run(_ngram(5)), "one.json")
    written = write_plots(runs, [], tmp_path)
    assert written[SWEEP_PNG] is None and not (tmp_path / SWEEP_PNG).exists()
    assert _is_png(tmp_path / ACCEPTANCE_PNG) and _is_png(tmp_path / SPEEDUP_PNG)


def test_k_sweep_groups_runs_that_differ_only_in_k():
    runs, _ = runs_of(SWEEP, "sweep.json")
    sweeps = k_sweeps(runs)
    assert list(sweeps) == [config_label({k: v for k, v in _ngram(1).items() if k != "num_speculative_tokens"})]
    (members,) = sweeps.values()
    assert [m.report["speculative_config"]["num_speculative_tokens"] for m in members] == [1, 3, 5]
    # another lookup setting is another curve; "auto" is no point on a K axis
    other = [_run({**_ngram(k), "prompt_lookup_max": 2}) for k in (2, 4)]
    auto = _run({"method": "ngram", "num_speculative_tokens": "auto", "max_num_speculative_tokens": 10})
    assert len(k_sweeps(runs_of({"runs": [*SWEEP["runs"], *other, auto]}, "x")[0])) == 2


def test_quantized_and_batched_reports(tmp_path):
    quantized = {"targets": [{"quantization": None, "report": SWEEP}, {"quantization": "int8", "report": SWEEP}],
                 "quantized_comparison": []}
    runs, batched = runs_of(quantized, "q.json")
    assert len(runs) == 8 and {r.prefix for r in runs} == {"bf16: ", "int8: "}
    assert len(k_sweeps(runs)) == 2  # one sweep per target
    runs, batched = runs_of(BATCHED, "b.json")
    assert runs == [] and write_plots(runs, batched, tmp_path) == {BATCH_PNG: str(tmp_path / BATCH_PNG)}
    assert _is_png(tmp_path / BATCH_PNG)


def test_labels_name_the_drafter_when_one_method_ran_with_several():
    runs, _ = runs_of({"runs": [_run({"method": "dflash", "model": "x/b8", "num_speculative_tokens": 7}),
                                _run({"method": "dflash", "model": "x/b16", "num_speculative_tokens": 15})]}, "r")
    from specdec.bench.plots import run_labels

    assert run_labels(runs) == ["dflash b8 K=7", "dflash b16 K=15"]


def test_cli_from_saved_reports(tmp_path, capsys):
    a = _write(tmp_path, "a.json", {"runs": SWEEP["runs"][:2]})
    b = _write(tmp_path, "b.json", SWEEP["runs"][2])
    assert main(["bench", "--from-report", str(a), "--from-report", str(b), "--plot", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.count("figure written") == 3
    assert _is_png(tmp_path / "out" / SWEEP_PNG)
    runs, _ = load_reports([a, b])
    assert [r.source for r in runs] == ["a.json", "a.json", "b.json"]


@pytest.mark.parametrize("args, message", [
    (["--from-report", "{good}"], "give --plot DIR too"),
    (["--from-report", "missing.json", "--plot", "{out}"], "no such file"),
    (["--from-report", "{bad}", "--plot", "{out}"], "is not JSON"),
    (["--from-report", "{other}", "--plot", "{out}"], "not a `specdec bench` JSON report"),
    (["--from-report", "{good}", "--plot", "{good}"], "is not a directory"),
    (["--from-report", "{good}", "--plot", "{out}", "--prompts", "p.jsonl"], "runs nothing"),
    ([], "needs --prompts"),
    (["--prompts", "p.jsonl", "--plot", "{good}"], "is not a directory"),
])
def test_bad_input_is_a_clear_error(tmp_path, capsys, args, message):
    files = {"good": _write(tmp_path, "good.json", SWEEP), "out": tmp_path / "out",
             "bad": tmp_path / "bad.json", "other": _write(tmp_path, "other.json", {"rows": []})}
    files["bad"].write_text("{not json")
    argv = ["bench", *[a.format(**{k: str(v) for k, v in files.items()}) for a in args]]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_plot_after_a_real_k_sweep_on_a_tiny_model(zoo, tmp_path, capsys):
    """End to end: a bench run of two draft lengths on the bigram model (n-gram lookup drafts there)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a b a b a b", "category": "copy"}\n{"prompt": "once upon", "category": "chat"}\n')
    sweep = json.dumps([{"method": "ngram", "num_speculative_tokens": k} for k in (2, 4)])
    argv = ["bench", "--prompts", str(prompts), "--model", zoo.path("bigram"), "--device", "cpu",
            "--max-new-tokens", "12", "--warmup", "0", "--speculative-config", sweep, "--no-progress",
            "--output", str(tmp_path / "r.json"), "--plot", str(tmp_path / "figs")]
    assert main(argv) == 0
    assert capsys.readouterr().out.count("figure written") == 3
    for name in (ACCEPTANCE_PNG, SPEEDUP_PNG, SWEEP_PNG):
        assert _is_png(tmp_path / "figs" / name)
    runs, _ = load_reports([tmp_path / "r.json"])
    assert set(runs[0].report["per_category"]) == {"copy", "chat"}
