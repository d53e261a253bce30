"""`specdec bench --include-llama-cpp` against a fake `llama_cpp` module: no llama-cpp-python, no GGUF file;
our side runs the tiny llama model."""

from __future__ import annotations

import itertools
import json
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.api import LLM
from specdec.bench.llama_cpp_rows import CTX_STEP, LlamaCppBaseline, import_llama_cpp, model_file, worker_died_message
from specdec.bench.runner import run_bench
from specdec.bench.table import notes
from specdec.bench.transformers_rows import GREEDY, PROMPT_LOOKUP
from specdec.cli import main
from specdec.sampling_params import SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
EOS = 2  # the tiny models' <eos>


class FakeLlama:
    """The part of llama_cpp.Llama the rows use; generate() yields `continuation(prompt, lookup)`."""

    instances: list[FakeLlama]

    @staticmethod
    def continuation(prompt: list[int], lookup: bool) -> Iterator[int]:
        return itertools.repeat(7)

    def __init__(self, model_path: str, **kwargs: Any) -> None:
        self.model_path, self.kwargs = model_path, kwargs
        self.resets = self.generations = 0
        self.used = False
        type(self).instances.append(self)

    def reset(self) -> None:
        self.resets += 1
        self.used = False

    def generate(self, tokens: list[int], **kwargs: Any) -> Iterator[int]:
        assert not self.used, "no reset() since the last prompt: llama.cpp would reuse its KV cache"
        assert kwargs["temp"] == 0.0 and kwargs["repeat_penalty"] == 1.0
        self.used = True
        self.generations += 1
        for token in type(self).continuation(list(tokens), self.kwargs["draft_model"] is not None):
            time.sleep(0.002)  # seconds well above the report's rounding (0.1 ms)
            yield token


class FakeLookup:
    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeLlama]:
    """A `llama_cpp` module in sys.modules; its Llama class (returned) records every instance."""
    llama_class = type("Llama", (FakeLlama,), {"instances": []})
    module = types.ModuleType("llama_cpp")
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    module.Llama = llama_class
    module.llama_speculative = speculative
    speculative.LlamaPromptLookupDecoding = FakeLookup
    monkeypatch.setattr("specdec.bench.llama_cpp_rows.ISOLATE", False)  # the fake lives in this process only
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    monkeypatch.setattr("specdec.models.loading.gguf_file", lambda name: "tiny.gguf")  # the tiny model has none
    return llama_class


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "the cat sat on the mat, the cat sat on the"}\n{"prompt": "hello hello hello"}\n')
    return path


def test_generate_stops_at_eos_and_max_new_tokens(fake):
    fake.continuation = lambda prompt, lookup: itertools.chain([5, 6, EOS], itertools.repeat(9))
    baseline = LlamaCppBaseline("m.gguf", eos_token_ids=[EOS], max_new_tokens=8, n_threads=3)
    ids, seconds = baseline.generate([1, 40, 41], GREEDY)
    assert ids == [5, 6, EOS] and seconds > 0  # the EOS kept, as our engine keeps it
    fake.continuation = lambda prompt, lookup: itertools.repeat(9)
    assert baseline.generate([1, 40, 41, 42], GREEDY)[0] == [9] * 8
    (llm,) = fake.instances  # one Llama per mode, reset before every prompt
    assert llm.generations == llm.resets == 2 and llm.model_path == "m.gguf"
    assert llm.kwargs["n_threads"] == llm.kwargs["n_threads_batch"] == 3 and llm.kwargs["n_ctx"] >= 4 + 8
    assert llm.kwargs["draft_model"] is None and llm.kwargs["logits_all"] is False


def test_prompt_lookup_draft_labels_and_a_growing_context(fake):
    baseline = LlamaCppBaseline("m.gguf", eos_token_ids=[EOS], max_new_tokens=4, lookup_tokens=5, max_ngram_size=3)
    baseline.generate([1] * 10, PROMPT_LOOKUP)
    baseline.generate([1] * (CTX_STEP + 10), PROMPT_LOOKUP)  # too long for the first context: a larger one
    small, large = fake.instances
    draft = small.kwargs["draft_model"]
    assert (draft.num_pred_tokens, draft.max_ngram_size) == (5, 3) and small.kwargs["logits_all"] is True
    assert (small.kwargs["n_ctx"], large.kwargs["n_ctx"]) == (CTX_STEP, 2 * CTX_STEP)
    assert baseline.describe(PROMPT_LOOKUP)["label"] == "llama.cpp prompt lookup (K=5), vs our bfloat16"
    same = LlamaCppBaseline("m.gguf", eos_token_ids=[EOS], max_new_tokens=4, compared_with="gguf")
    assert same.describe(GREEDY)["label"] == "llama.cpp greedy, vs our gguf"
    assert same.describe(PROMPT_LOOKUP)["max_ngram_size"] == 2  # the library's default when ours has none


def test_missing_llama_cpp_says_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # importing it now fails, installed or not
    with pytest.raises(ValueError, match="pip install llama-cpp-python"):
        import_llama_cpp()
    with pytest.raises(ValueError, match="pip install llama-cpp-python"):
        LlamaCppBaseline("m.gguf", eos_token_ids=[EOS], max_new_tokens=4)
    # checked before the model loads: the missing model file is never reached
    missing = str(tmp_path / "missing.gguf")
    assert main(["bench", "--prompts", str(_prompts(tmp_path)), "--model", missing, "--include-llama-cpp"]) == 2
    assert "pip install llama-cpp-python" in capsys.readouterr().err


def test_model_must_be_a_gguf_file(tmp_path):
    with pytest.raises(ValueError, match="runs llama.cpp on a GGUF file: .* is not a GGUF file"):
        model_file(str(tmp_path))  # a model folder
    with pytest.raises(ValueError, match="GGUF file not found"):
        model_file(str(tmp_path / "missing.gguf"))


def test_rows_in_the_report(zoo, fake, tmp_path):
    loaded = zoo.load("llama")
    replay = LLM(loaded=loaded)
    replay_params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)

    def continuation(prompt: list[int], lookup: bool) -> Iterator[int]:
        """Greedy: our own greedy tokens (so identical to our plain run, once cut at EOS and max_new_tokens);
        prompt lookup: a token our plain run does not start with, twice, then EOS."""
        (out,) = replay.generate([{"prompt_token_ids": prompt}], replay_params)
        ours = list(out.outputs[0].token_ids)
        other = 3 if ours[0] != 3 else 4
        return iter([other, other, EOS, other]) if lookup else iter(ours)

    fake.continuation = continuation
    report = run_bench(_prompts(tmp_path), speculative_config=NGRAM, max_new_tokens=12, include_llama_cpp=True,
                       progress=False, loaded=loaded)
    rows, overall = report["llama_cpp"], report["overall"]
    assert set(rows) == {"greedy", "prompt_lookup"} and "transformers" not in report
    greedy, lookup = rows["greedy"], rows["prompt_lookup"]
    assert greedy["identical_to_plain"] == 2 and greedy["identical_to_plain_fraction"] == 1.0
    assert greedy["identical_to_llama_cpp_greedy"] == 2 and greedy["new_tokens"] == overall["new_tokens"]
    assert lookup["identical_to_plain"] == 0 and lookup["identical_to_llama_cpp_greedy"] == 0
    assert lookup["new_tokens"] == 2 * 3  # stopped at EOS
    assert (lookup["num_pred_tokens"], lookup["max_ngram_size"]) == (4, 3)
    assert greedy["label"] == "llama.cpp greedy, vs our bfloat16" and greedy["n_threads"] == torch.get_num_threads()
    for row in rows.values():
        assert row["prompts"] == 2
        assert row["tokens_per_second"] == pytest.approx(row["new_tokens"] / row["seconds"], rel=1e-2)
        assert row["speedup_vs_plain"] == pytest.approx(overall["baseline_seconds"] / row["seconds"], rel=1e-2)
    for e in report["per_prompt"]:
        assert e["llama_cpp"]["greedy"]["identical_to_plain"] and e["llama_cpp"]["greedy"]["first_divergence"] is None
        t = e["llama_cpp"]["prompt_lookup"]
        assert t["first_divergence"] == 0 and t["divergence_tokens"]["llama_cpp_token"] in (3, 4)
    # one Llama per mode, built in the warm-up; reset before each of its 3 prompts (1 warm-up + 2)
    assert [(llm.generations, llm.resets) for llm in fake.instances] == [(3, 3), (3, 3)]
    assert any("llama.cpp runs the GGUF file's quantized weights" in n for n in notes(report))


def test_cli_rows_and_errors(zoo, fake, tmp_path, capsys):
    prompts, out = str(_prompts(tmp_path)), tmp_path / "r.json"
    assert main([
        "bench", "--prompts", prompts, "--model", zoo.path("llama"), "--dtype", "bfloat16", "--device", "cpu",
        "--speculative-config", json.dumps(NGRAM), "--max-new-tokens", "6", "--include-llama-cpp",
        "--output", str(out), "--no-progress",
    ]) == 0
    stdout = capsys.readouterr().out
    assert "llama.cpp greedy, vs our bfloat16" in stdout and "llama.cpp prompt lookup (K=4)" in stdout
    assert set(json.loads(out.read_text())["llama_cpp"]) == {"greedy", "prompt_lookup"}
    assert main(["bench", "--prompts", prompts, "--batch-size", "1,4", "--include-llama-cpp"]) == 2
    assert "batch 1 only" in capsys.readouterr().err
    # a list of one config is that config; two are refused
    assert main([
        "bench", "--prompts", prompts, "--model", zoo.path("llama"), "--dtype", "bfloat16", "--device", "cpu",
        "--speculative-config", json.dumps([NGRAM]), "--max-new-tokens", "6", "--include-llama-cpp",
        "--output", str(out), "--no-progress",
    ]) == 0
    assert set(json.loads(out.read_text())["llama_cpp"]) == {"greedy", "prompt_lookup"}
    capsys.readouterr()
    assert main([
        "bench", "--prompts", prompts, "--model", zoo.path("llama"), "--speculative-config",
        json.dumps([NGRAM, NGRAM]), "--include-llama-cpp", "--no-progress",
    ]) == 2
    assert "one speculative config at a time" in capsys.readouterr().err


def test_a_crashed_worker_names_the_likely_cause():
    assert worker_died_message(1) == "the llama.cpp worker process died (exit code 1)"
    crashed = worker_died_message(-11)
    assert "exit code -11" in crashed and "GGML_NATIVE=OFF" in crashed
