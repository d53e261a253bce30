"""`specdec bench` on a tiny random model: report schema, identity, aggregation, filters, transformers rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
for _p in (_ROOT / "src", _ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import pytest  # noqa: E402

from specdec.bench.divergence import diagnose, first_divergence  # noqa: E402
from specdec.bench.prompts import (  # noqa: E402
    DEFAULT_CATEGORY, load_questions, render_prompt, render_text,
)
from specdec.bench.runner import run_bench  # noqa: E402
from specdec.bench.table import notes, print_report  # noqa: E402
from specdec.cli import main  # noqa: E402
from tiny_models import make_tiny_model  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
MT_BENCH = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem about the sea, the sea.", "Now make it rhyme."]},
    {"question_id": 82, "category": "math", "turns": ["What is 2+2? 2+2 is", "And 3+3?"]},
    {"question_id": 83, "category": "writing", "turns": ["Describe a cat. The cat, the cat.", "Shorter."]},
]
PROMPT_LINES = [
    {"prompt": "the cat sat on the mat, the cat sat on the", "category": "math"},
    {"prompt": "hello hello hello hello"},
]
OVERALL_KEYS = {
    "prompts": int, "new_tokens": int, "baseline_seconds": float, "speculative_seconds": float, "speedup": float,
    "mean_acceptance_length": float, "acceptance_rate": float, "identical": int, "identical_fraction": float,
    "baseline_tokens_per_second": float, "speculative_tokens_per_second": float, "accepted_per_position": list,
    "acceptance_rate_per_position": list,
}
REPORT_KEYS = {
    "model", "method", "speculative_config", "dtype", "max_new_tokens", "temperature", "device", "exact_runtime",
    "overall", "per_category", "per_prompt",
}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")


@pytest.fixture(scope="module")
def loaded(tiny):
    from specdec.models.loading import load_model

    return load_model(tiny, dtype="bfloat16", device="cpu")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("prompts")
    return {
        "mt": _write_jsonl(d / "mt.jsonl", MT_BENCH),
        "plain": _write_jsonl(d / "plain.jsonl", PROMPT_LINES),
        "mixed": _write_jsonl(d / "mixed.jsonl", MT_BENCH + PROMPT_LINES),
    }


@pytest.fixture(scope="module")
def report(loaded, files) -> dict:
    return run_bench(files["mixed"], speculative_config=NGRAM, max_new_tokens=16, progress=False, loaded=loaded)


def _check_aggregate(agg: dict) -> None:
    for key, typ in OVERALL_KEYS.items():
        assert isinstance(agg[key], typ), (key, agg[key])
    assert agg["speedup"] == pytest.approx(agg["baseline_seconds"] / agg["speculative_seconds"], rel=1e-2, abs=1e-3)
    # the decode phase alone: each mode's prefill (measured, not zero) left out
    assert 0 < agg["baseline_prefill_seconds"] < agg["baseline_seconds"]
    assert 0 < agg["speculative_prefill_seconds"] < agg["speculative_seconds"]
    decode = (agg["baseline_seconds"] - agg["baseline_prefill_seconds"]) / (
        agg["speculative_seconds"] - agg["speculative_prefill_seconds"])
    assert agg["decode_speedup"] == pytest.approx(decode, rel=1e-2, abs=1e-3)


# ---- prompt file and rendering ----


def test_load_questions_both_schemas(files):
    qs = load_questions(files["mixed"])
    assert [q.question_id for q in qs] == [81, 82, 83, 4, 5]  # prompt lines fall back to the line number
    assert [len(q.turns) for q in qs] == [2, 2, 2, 1, 1]
    assert qs[3].category == "math" and qs[4].category == DEFAULT_CATEGORY
    assert [q.question_id for q in load_questions(files["mixed"], categories=["writing"])] == [81, 83]
    assert [q.question_id for q in load_questions(files["mixed"], limit=2, categories=["math"])] == [82, 4]
    assert [q.question_id for q in load_questions(files["mixed"], per_category=1)] == [81, 82, 5]
    assert [q.question_id for q in load_questions(files["mixed"], per_category=1, limit=2)] == [81, 82]
    assert [q.question_id for q in load_questions(files["mixed"], per_category=2, categories=["math"])] == [82, 4]


def test_load_questions_errors(tmp_path, files):
    with pytest.raises(ValueError, match="not found"):
        load_questions(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="no prompts in categories"):
        load_questions(files["mt"], categories=["nope"])
    with pytest.raises(ValueError, match="--per-category must be >= 1"):
        load_questions(files["mt"], per_category=0)
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"text": "x"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a line needs 'turns'"):
        load_questions(bad)
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match="broken.jsonl:2"):
        load_questions(tmp_path / "broken.jsonl")


def test_render_without_chat_template(loaded):
    assert render_text(["Hi?"], []) == "Question: Hi?\nAnswer:"
    assert render_text(["Hi?", "More?"], [" Hello."]) == "Question: Hi?\nAnswer: Hello.\nQuestion: More?\nAnswer:"
    tok = loaded.tokenizer
    assert render_prompt(tok, ["Hi?"], []) == list(tok("Question: Hi?\nAnswer:").input_ids)


def test_render_with_chat_template(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    ids = render_prompt(tok, ["Hi?", "More?"], [" Hello. "])
    assert tok.decode(ids) == "<bos><user>Hi?\n<assistant>Hello.\n<user>More?\n<assistant>"


ANSWERED = {"question_id": 90, "category": "chat", "turns": ["Do you like cats?", "Why?", "And dogs?"],
            "answers": ["Yes, I do.", " They purr."]}


def test_given_answers_benchmark_the_last_turn_only(tmp_path):
    from specdec.bench.prompts import Question

    path = _write_jsonl(tmp_path / "a.jsonl", [ANSWERED, MT_BENCH[0]])
    q, plain = load_questions(path)
    assert q.turns == tuple(ANSWERED["turns"]) and q.answers == (" Yes, I do.", " They purr.")  # leading space added
    assert list(q.benchmarked_turns()) == [2]
    assert plain.answers is None and list(plain.benchmarked_turns()) == [0, 1]
    assert list(Question(1, "x", ("only",), ()).benchmarked_turns()) == [0]  # one turn, no answers needed


def test_given_answers_errors(tmp_path):
    for answers, match in [(["a"], "3 turns need 2 answers, got 1"), (["a", "b", "c"], "got 3"),
                           ("a b", "list of strings"), (["a", 2], "list of strings")]:
        path = _write_jsonl(tmp_path / "bad.jsonl", [{**ANSWERED, "answers": answers}])
        with pytest.raises(ValueError, match=match):
            load_questions(path)
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "Hi?", "answers": []}])
    with pytest.raises(ValueError, match="'answers' needs 'turns'"):
        load_questions(path)


def test_first_prompt_replays_given_answers(loaded, tmp_path):
    from specdec.bench.prompts import first_prompt

    tok = loaded.tokenizer
    q, plain = load_questions(_write_jsonl(tmp_path / "a.jsonl", [ANSWERED, MT_BENCH[0]]))
    text = "Question: Do you like cats?\nAnswer: Yes, I do.\nQuestion: Why?\nAnswer: They purr.\nQuestion: And dogs?\nAnswer:"
    assert first_prompt(tok, q) == list(tok(text).input_ids)
    assert first_prompt(tok, plain) == render_prompt(tok, MT_BENCH[0]["turns"][:1], [])


def test_bench_runs_one_generation_per_answered_question(loaded, tmp_path):
    path = _write_jsonl(tmp_path / "a.jsonl", [ANSWERED, MT_BENCH[1]])
    report = run_bench(path, speculative_config=NGRAM, max_new_tokens=6, progress=False, loaded=loaded, warmup=1)
    assert [(e["question_id"], e["turn"]) for e in report["per_prompt"]] == [(90, 3), (82, 1), (82, 2)]
    (q, _) = load_questions(path)
    from specdec.bench.prompts import first_prompt

    assert report["per_prompt"][0]["prompt_tokens"] == len(first_prompt(loaded.tokenizer, q))
    assert report["overall"]["prompts"] == 3 and report["overall"]["identical_fraction"] == 1.0


def test_serve_load_sends_the_given_conversation(tmp_path):
    import argparse

    from specdec.bench.serve_load import load_prompts, request_body

    path = _write_jsonl(tmp_path / "a.jsonl", [ANSWERED, MT_BENCH[0]])
    q, plain, again = load_prompts(str(path), 3)
    args = argparse.Namespace(max_tokens=4, temperature=0.0, seed=None, ignore_eos=False, endpoint="chat")
    assert [m["role"] for m in request_body(q, args, "m")["messages"]] == ["user", "assistant"] * 2 + ["user"]
    assert request_body(q, args, "m")["messages"][1]["content"] == "Yes, I do."
    assert request_body(plain, args, "m")["messages"] == [{"role": "user", "content": MT_BENCH[0]["turns"][0]}]
    args.endpoint = "completions"
    assert request_body(q, args, "m")["prompt"].endswith("They purr.\nQuestion: And dogs?\nAnswer:")
    assert request_body(plain, args, "m")["prompt"] == f"Question: {MT_BENCH[0]['turns'][0]}\nAnswer:"
    assert again == q


# ---- divergence ----


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], []) is None


def test_diagnose_reports_target_margin(loaded):
    from specdec.api import LLM
    from specdec.sampling_params import SamplingParams

    llm = LLM(loaded=loaded)
    prompt = render_prompt(loaded.tokenizer, ["Write a poem."], [])
    (out,) = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    plain = out.outputs[0].token_ids
    other = list(plain)
    other[3] = (other[3] + 1) % loaded.vocab_size
    d = diagnose(loaded.new_runtime(), prompt, plain, other)
    assert d.position == 3 and d.baseline_token == plain[3] and d.other_token == other[3]
    assert d.target_token == plain[3]  # greedy on an exact runtime: the target's argmax is the plain token
    assert d.logit_margin >= 0 and d.logit_gap >= d.logit_margin
    assert diagnose(loaded.new_runtime(), prompt, plain, plain) is None


# ---- the benchmark ----


def test_report_schema_and_identity(report):
    assert REPORT_KEYS <= set(report)
    assert report["method"] == "ngram" and report["speculative_config"]["num_speculative_tokens"] == 4
    assert report["exact_runtime"] is True and report["dtype"] == "bfloat16" and report["device"] == "cpu"
    assert report["max_new_tokens"] == 16 and report["temperature"] == 0.0
    assert "transformers" not in report
    overall = report["overall"]
    _check_aggregate(overall)
    assert overall["prompts"] == 8  # 3 questions x 2 turns + 2 prompt lines
    assert overall["identical_fraction"] == 1.0 and overall["identical"] == 8
    assert overall["new_tokens"] == overall["speculative_new_tokens"] > 0
    assert overall["mean_acceptance_length"] >= 1.0
    json.dumps(report)  # serializable


def test_per_prompt_entries(report):
    entries = report["per_prompt"]
    assert [(e["question_id"], e["turn"]) for e in entries] == [
        (81, 1), (81, 2), (82, 1), (82, 2), (83, 1), (83, 2), (4, 1), (5, 1)
    ]
    for e in entries:
        assert set(e["new_tokens"]) == {"baseline", "speculative"} and set(e["seconds"]) == {"baseline", "speculative"}
        assert isinstance(e["prompt_tokens"], int) and e["identical"] is True
        assert e["first_divergence"] is None and e["logit_margin"] is None
    # turn 2 contains turn 1's prompt and the plain answer
    t1, t2 = entries[0], entries[1]
    assert t2["prompt_tokens"] > t1["prompt_tokens"] + t1["new_tokens"]["baseline"] - 1


def test_per_category_aggregation(report):
    cats = report["per_category"]
    assert list(cats) == ["writing", "math", DEFAULT_CATEGORY]
    for name, agg in cats.items():
        _check_aggregate(agg)
        entries = [e for e in report["per_prompt"] if e["category"] == name]
        assert agg["prompts"] == len(entries)
        assert agg["new_tokens"] == sum(e["new_tokens"]["baseline"] for e in entries)
        assert agg["baseline_seconds"] == pytest.approx(sum(e["seconds"]["baseline"] for e in entries), abs=1e-3)
        assert agg["speculative_seconds"] == pytest.approx(sum(e["seconds"]["speculative"] for e in entries), abs=1e-3)
    assert cats["writing"]["prompts"] == 4 and cats["math"]["prompts"] == 3 and cats[DEFAULT_CATEGORY]["prompts"] == 1
    overall = report["overall"]
    for key in ("prompts", "new_tokens", "identical"):
        assert sum(c[key] for c in cats.values()) == overall[key]
    assert sum(c["baseline_seconds"] for c in cats.values()) == pytest.approx(overall["baseline_seconds"], abs=1e-3)


def test_cli_limit_categories_output(tiny, files, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main([
        "bench", "--prompts", str(files["mixed"]), "--model", tiny, "--dtype", "bfloat16", "--device", "cpu",
        "--speculative-config", json.dumps(NGRAM), "--max-new-tokens", "12", "--limit", "2",
        "--categories", "math,writing", "--output", str(out), "--no-progress",
    ])
    assert rc == 0
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert REPORT_KEYS <= set(report)
    assert json.loads(stdout.strip().splitlines()[-1]) == report["overall"]  # machine-readable last line
    assert "overall" in stdout and "speedup" in stdout
    assert [(e["question_id"], e["turn"]) for e in report["per_prompt"]] == [(81, 1), (81, 2), (82, 1), (82, 2)]
    assert set(report["per_category"]) == {"writing", "math"}
    assert report["overall"]["identical_fraction"] == 1.0


def test_cli_per_category(tiny, files, tmp_path):
    out = tmp_path / "r.json"
    assert main([
        "bench", "--prompts", str(files["mixed"]), "--model", tiny, "--dtype", "bfloat16", "--device", "cpu",
        "--speculative-config", json.dumps(NGRAM), "--max-new-tokens", "4", "--per-category", "1",
        "--output", str(out), "--no-progress",
    ]) == 0
    report = json.loads(out.read_text())
    assert [e["question_id"] for e in report["per_prompt"]] == [81, 81, 82, 82, 5]  # one question per category


def test_cli_prompt_lines_with_transformers(tiny, files, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main([
        "bench", "--prompts", str(files["plain"]), "--model", tiny, "--dtype", "bfloat16", "--device", "cpu",
        "--speculative-config", json.dumps(NGRAM), "--max-new-tokens", "12", "--include-transformers",
        "--output", str(out), "--no-progress",
    ])
    assert rc == 0
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    rows = report["transformers"]
    assert set(rows) == {"greedy", "prompt_lookup"}
    assert rows["prompt_lookup"]["prompt_lookup_num_tokens"] == 4
    assert rows["prompt_lookup"]["max_matching_ngram_size"] == 3
    for row in rows.values():
        assert row["prompts"] == 2 and row["new_tokens"] > 0 and row["tokens_per_second"] > 0
        assert 0 <= row["identical_to_plain"] <= 2
        assert row["speedup_vs_plain"] == pytest.approx(
            report["overall"]["baseline_seconds"] / row["seconds"], rel=1e-2, abs=1e-3
        )
    assert rows["greedy"]["identical_to_transformers_greedy"] == 2
    for e in report["per_prompt"]:
        assert set(e["transformers"]) == {"greedy", "prompt_lookup"}
        for t in e["transformers"].values():
            assert (t["first_divergence"] is None) == t["identical_to_plain"] == (t["logit_margin"] is None)
    assert "transformers prompt lookup" in stdout


def test_sampling_is_reported_not_failed(loaded, files):
    report = run_bench(
        files["plain"], speculative_config=NGRAM, max_new_tokens=8, temperature=0.8, warmup=0,
        progress=False, loaded=loaded,
    )
    assert report["temperature"] == 0.8 and report["seed"] == 0
    _check_aggregate(report["overall"])
    for e in report["per_prompt"]:
        assert (e["first_divergence"] is None) == e["identical"]
        assert (e["logit_margin"] is None) == e["identical"]
    assert any("not expected" in n for n in notes(report))


def test_table_mentions_inexact_runtime_and_mismatches(report):
    from rich.console import Console

    fake = json.loads(json.dumps(report))
    fake["exact_runtime"] = False
    fake["per_prompt"][0].update(
        identical=False, first_divergence=5, logit_margin=0.01,
        divergence_tokens={"baseline_token": 1, "speculative_token": 2, "target_token": 1},
    )
    console = Console(record=True, width=200)
    print_report(fake, console)
    text = console.export_text()
    assert "NOT bit-exact" in text and "differ from our plain" in text and "0.0100" in text


def test_bad_arguments_exit_2(files, capsys):
    assert main(["bench", "--prompts", str(files["mt"]), "--speculative-config", "{oops"]) == 2
    assert main(["bench", "--prompts", str(files["mt"]) + ".missing"]) == 2
    assert "error" in capsys.readouterr().err


def test_several_methods_in_one_run(zoo, tmp_path):
    """A list of configs: each method after the same plain run, one report per method plus a comparison."""
    from specdec.bench.runner import run_bench

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "The quick brown fox"}\n{"prompt": "Once upon a time"}\n')
    configs = [{"method": "ngram", "num_speculative_tokens": 3},
               {"method": "draft_model", "model": "self:2", "num_speculative_tokens": 2}]
    report = run_bench(prompts, speculative_config=configs, loaded=zoo.load("llama"), max_new_tokens=16,
                       warmup=0, progress=False)
    assert [r["method"] for r in report["runs"]] == ["ngram", "draft_model"]
    assert [c["speculative_config"]["method"] for c in report["comparison"]] == ["ngram", "draft_model"]
    for run in report["runs"]:
        assert run["overall"]["identical_fraction"] == 1.0
    # the same plain runs back every method
    assert report["runs"][0]["overall"]["baseline_seconds"] == report["runs"][1]["overall"]["baseline_seconds"]


def test_auto_configs_report_what_their_policy_priced(zoo, tmp_path):
    """An "auto" config's report carries its policy's state at the end (cost curve, target scale, drafting
    cost), so that a run which drafted little can be told apart from one whose pricing went wrong."""
    from specdec.bench.runner import run_bench

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "The quick brown fox"}\n')
    configs = [{"method": "ngram", "num_speculative_tokens": "auto", "max_num_speculative_tokens": 4},
               {"method": "ngram", "num_speculative_tokens": 3}]
    report = run_bench(prompts, speculative_config=configs, loaded=zoo.load("llama"), max_new_tokens=8,
                       warmup=0, progress=False)
    auto, fixed = report["runs"]
    policy = auto["draft_length_policy"]
    assert policy["policy"] == "auto" and policy["max_num_speculative_tokens"] == 4
    assert policy["cost_curve"]["rows"][0] == 1 and len(policy["cost_curve"]["ms"]) == len(policy["cost_curve"]["rows"])
    assert "draft_length_policy" not in fixed
