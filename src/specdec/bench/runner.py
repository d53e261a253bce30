"""Runs the benchmark: plain and speculative decoding, interleaved prompt by prompt, in one process.

One loaded model serves both modes (two LLM objects, each with its own KV cache). For every turn of
every question: render the prompt (earlier turns use the plain run's answers, so both modes get the
same prompt ids; a question with given `answers` replays those and runs its last turn only), time plain
decoding, then speculative decoding right after it (and transformers' generate and llama.cpp when asked),
so machine noise hits both alike. `warmup` prompts run untimed in every mode first. Mismatches are
diagnosed after timing by one extra prefill on a separate runtime.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from specdec.api import LLM
from specdec.bench.divergence import diagnose
from specdec.bench.llama_cpp_rows import LlamaCppBaseline, import_llama_cpp, model_file
from specdec.bench.prompts import Question, first_prompt, has_chat_template, load_questions, render_prompt
from specdec.bench.report import PromptResult, build_report
from specdec.bench.transformers_rows import MODES, TransformersBaseline, lookup_settings, summarize_rows, synchronize
from specdec.models.loading import DEFAULT_MODEL, LoadedModel, load_model
from specdec.sampling_params import SamplingParams
from specdec.speculative_config import SpeculativeConfig

DEFAULT_SPECULATIVE_CONFIG = {"method": "ngram"}


def _timed_generate(llm: LLM, prompt: Sequence[int], params: SamplingParams) -> tuple[list[int], str, Any, float]:
    """(token ids, text, stats, wall seconds) of one request."""
    device = llm.model.device
    synchronize(device)
    start = time.perf_counter()
    (out,) = llm.generate([{"prompt_token_ids": list(prompt)}], params)
    synchronize(device)
    seconds = time.perf_counter() - start
    return out.outputs[0].token_ids, out.outputs[0].text, out.spec_decoding_stats, seconds


def _transformers_baseline(loaded: LoadedModel, config: SpeculativeConfig, plain: LLM, max_new_tokens: int):
    hf_loaded = loaded if loaded.hf_model is not None else load_model(
        loaded.name, dtype=loaded.dtype, device=loaded.device, native=False
    )
    k, ngram = lookup_settings(config)
    return TransformersBaseline(
        model=hf_loaded.hf_model,
        eos_token_ids=plain.eos_token_ids,
        pad_token_id=getattr(loaded.tokenizer, "pad_token_id", None),
        max_new_tokens=max_new_tokens,
        lookup_tokens=k,
        max_matching_ngram_size=ngram,
    )


def _llama_cpp_baseline(loaded: LoadedModel, path: str, config: SpeculativeConfig, plain: LLM,
                        max_new_tokens: int) -> LlamaCppBaseline:
    k, ngram = lookup_settings(config)
    return LlamaCppBaseline(
        model_path=path,
        eos_token_ids=plain.eos_token_ids,
        max_new_tokens=max_new_tokens,
        lookup_tokens=k,
        max_ngram_size=ngram,
        n_threads=torch.get_num_threads(),  # as many threads as ours
        n_gpu_layers=-1 if loaded.device.type == "cuda" else 0,
        compared_with=loaded.quantization or str(loaded.dtype).removeprefix("torch."),
    )


def run_bench(
    prompts: str | Path,
    *,
    model: str = DEFAULT_MODEL,
    speculative_config: dict[str, Any] | SpeculativeConfig | Sequence[dict[str, Any] | SpeculativeConfig] | None = None,
    dtype: str = "bfloat16",
    device: str | None = None,
    quantization: str | None = None,
    limit: int | None = None,
    categories: Sequence[str] | None = None,
    per_category: int | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    warmup: int = 1,
    include_transformers: bool = False,
    include_llama_cpp: bool = False,
    progress: bool = True,
    loaded: LoadedModel | None = None,
) -> dict[str, Any]:
    """Benchmarks plain vs speculative decoding on a jsonl prompt file; returns the JSON report (a dict).

    `loaded` reuses an already loaded model (then `model`, `dtype`, `device` and `quantization` are taken
    from it); `quantization` ("int8", "int4", "w8a8_int8", "gguf") quantizes the target's weights.
    `include_transformers` / `include_llama_cpp` add rows for those libraries on the same prompts (batch 1;
    llama.cpp needs llama-cpp-python and a GGUF model: transformers_rows.py, llama_cpp_rows.py).
    A list of speculative configs runs every method right after the same plain run of each prompt and
    returns {"runs": [one report per config], "comparison": [...]}: ratios from one run, side by side.
    """
    from tqdm import tqdm

    if speculative_config is None:
        speculative_config = dict(DEFAULT_SPECULATIVE_CONFIG)
    many = isinstance(speculative_config, (list, tuple))
    if many and len(speculative_config) == 1 and (include_transformers or include_llama_cpp):
        many, speculative_config = False, speculative_config[0]  # a list of one is that config
    configs = [
        # a dict is resolved for this target: a drafter's stored default may depend on its quantization and device
        SpeculativeConfig.from_dict(c, *((loaded.quantization, loaded.device) if loaded is not None
                                         else (quantization, device)))
        if isinstance(c, dict) else c
        for c in (speculative_config if many else [speculative_config])
    ]
    if not configs:
        raise ValueError("no speculative config to benchmark")
    if many and include_transformers:
        raise ValueError("--include-transformers works with one speculative config at a time")
    if many and include_llama_cpp:
        raise ValueError("--include-llama-cpp works with one speculative config at a time")
    if warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {warmup}")
    params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed)
    questions = load_questions(prompts, limit=limit, categories=categories, per_category=per_category)
    gguf: str | None = None
    if include_llama_cpp:  # before the model load: no llama-cpp-python, or no GGUF file, fails at once
        import_llama_cpp()
        gguf = model_file(loaded.name if loaded is not None else model)

    if loaded is None:
        loaded = load_model(model, dtype=dtype, device=device, quantization=quantization)
    plain = LLM(loaded=loaded)
    specs = [LLM(loaded=loaded, speculative_config=c) for c in configs]
    tokenizer = loaded.tokenizer
    hf = _transformers_baseline(loaded, configs[0], plain, max_new_tokens) if include_transformers else None
    llama = _llama_cpp_baseline(loaded, gguf, configs[0], plain, max_new_tokens) if gguf is not None else None
    torch.manual_seed(seed)

    for q in questions[:warmup]:
        ids = first_prompt(tokenizer, q)
        plain.generate([{"prompt_token_ids": ids}], params)
        for s in specs:
            s.generate([{"prompt_token_ids": ids}], params)
        for mode in MODES if hf is not None else ():
            hf.generate(ids, mode)
        for mode in MODES if llama is not None else ():
            llama.generate(ids, mode)  # also builds its Llama objects, untimed

    def counters() -> list[dict[str, int]]:
        return [s.proposer.counters() if s.proposer is not None else {} for s in specs]

    counted_from = counters()  # the warm-up does not count
    per_config: list[list[PromptResult]] = [[] for _ in specs]
    total = sum(len(q.benchmarked_turns()) for q in questions)
    try:
        with tqdm(total=total, desc="bench", unit="turn", disable=not progress, dynamic_ncols=True) as bar:
            for q in questions:
                for i, rows in enumerate(_run_question(q, plain, specs, hf, llama, params, bar)):
                    per_config[i].extend(rows)
                base = sum(r.baseline_seconds for r in per_config[0])
                speedups = [base / sum(r.speculative_seconds for r in rows) for rows in per_config]
                bar.set_postfix(speedup="/".join(f"{x:.2f}x" for x in speedups),
                                identical="/".join(str(sum(r.identical for r in rows)) for rows in per_config))
    finally:
        if llama is not None:
            llama.close()  # its worker process

    reports = [
        _report(rows, loaded, config, plain, hf, llama, max_new_tokens, temperature, seed, tokenizer)
        for rows, config in zip(per_config, configs)
    ]
    for report, start, end in zip(reports, counted_from, counters()):
        if end:
            report["proposer_counters"] = {k: v - start.get(k, 0) for k, v in end.items()}
    for report, spec in zip(reports, specs):
        if spec.speculative_config is not None and spec.speculative_config.auto:
            # what "auto" priced drafts with at the end: its cost curve, target scale and drafting cost
            report["draft_length_policy"] = spec.draft_length_policy.describe()
    if not many:
        return reports[0]
    return {"runs": reports, "comparison": [comparison_row(r) for r in reports]}


def comparison_row(report: dict[str, Any]) -> dict[str, Any]:
    o = report["overall"]
    keys = ("speedup", "decode_speedup", "mean_acceptance_length", "acceptance_rate",
            "identical_fraction", "baseline_tokens_per_second", "speculative_tokens_per_second",
            "acceptance_rate_per_position")
    return {"speculative_config": report["speculative_config"], **{k: o.get(k) for k in keys}}


def _report(results: list[PromptResult], loaded: LoadedModel, speculative_config: SpeculativeConfig, plain: LLM,
            hf: TransformersBaseline | None, llama: LlamaCppBaseline | None, max_new_tokens: int, temperature: float,
            seed: int, tokenizer: Any) -> dict[str, Any]:
    diag_runtime = loaded.new_runtime()
    for r in results:
        r.divergence = diagnose(diag_runtime, r.prompt_ids, r.baseline_ids, r.speculative_ids)
        for mode, (ids, _) in r.transformers.items():
            r.transformers_divergence[mode] = diagnose(diag_runtime, r.prompt_ids, r.baseline_ids, ids)
        for mode, (ids, _) in r.llama_cpp.items():
            r.llama_cpp_divergence[mode] = diagnose(diag_runtime, r.prompt_ids, r.baseline_ids, ids)

    plain_ids = [r.baseline_ids for r in results]
    plain_seconds = sum(r.baseline_seconds for r in results)
    plain_tokens = sum(len(ids) for ids in plain_ids)
    transformers = None if hf is None else summarize_rows(
        [r.transformers for r in results], plain_ids, plain_seconds, plain_tokens, baseline=hf)
    llama_cpp = None if llama is None else summarize_rows(
        [r.llama_cpp for r in results], plain_ids, plain_seconds, plain_tokens, baseline=llama, peer="llama_cpp")
    return build_report(
        results,
        model=loaded.name,
        speculative_config=speculative_config.to_dict(),
        dtype=str(loaded.dtype).removeprefix("torch."),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        device=str(loaded.device),
        exact_runtime=bool(plain.runtime.exact),
        chat_template=has_chat_template(tokenizer),
        transformers=transformers,
        llama_cpp=llama_cpp,
    )


def _run_question(
    q: Question, plain: LLM, specs: list[LLM], hf: TransformersBaseline | None, llama: LlamaCppBaseline | None,
    params: SamplingParams, bar: Any,
) -> list[list[PromptResult]]:
    """One list of results per speculative LLM; every method runs right after the same plain run."""
    given = q.answers is not None
    answers: list[str] = list(q.answers) if given else []  # given, or the plain run's own as they come
    out: list[list[PromptResult]] = [[] for _ in specs]
    for t in q.benchmarked_turns():
        prompt = render_prompt(plain.tokenizer, q.turns[: t + 1], answers[:t])
        base_ids, base_text, base_stats, base_s = _timed_generate(plain, prompt, params)
        for i, spec in enumerate(specs):
            spec_ids, _, spec_stats, spec_s = _timed_generate(spec, prompt, params)
            hf_runs = {mode: hf.generate(prompt, mode) for mode in MODES} if hf is not None else {}
            llama_runs = {mode: llama.generate(prompt, mode) for mode in MODES} if llama is not None else {}
            out[i].append(
                PromptResult(
                    question_id=q.question_id, category=q.category, turn=t + 1, prompt_ids=prompt,
                    baseline_ids=list(base_ids), speculative_ids=list(spec_ids), baseline_seconds=base_s,
                    speculative_seconds=spec_s, speculative_stats=spec_stats, transformers=hf_runs,
                    llama_cpp=llama_runs,
                    baseline_prefill_seconds=base_stats.prefill_seconds if base_stats is not None else 0.0,
                )
            )
        if not given:
            answers.append(base_text)
        bar.update(1)
    return out
