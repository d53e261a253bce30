"""Runs the benchmark: plain and speculative decoding, interleaved prompt by prompt, in one process.

One loaded model serves both modes (two LLM objects, each with its own KV cache). For every turn of
every question: render the prompt (earlier turns use the plain run's answers, so both modes get the
same prompt ids), time plain decoding, then speculative decoding right after it (and transformers'
generate when asked), so machine noise hits both alike. `warmup` prompts run untimed in every mode
first. Mismatches are diagnosed after timing by one extra prefill on a separate runtime.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from specdec.api import LLM
from specdec.bench.divergence import diagnose
from specdec.bench.prompts import Question, has_chat_template, load_questions, render_prompt
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


def run_bench(
    prompts: str | Path,
    *,
    model: str = DEFAULT_MODEL,
    speculative_config: dict[str, Any] | SpeculativeConfig | None = None,
    dtype: str = "bfloat16",
    device: str | None = None,
    limit: int | None = None,
    categories: Sequence[str] | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    warmup: int = 1,
    include_transformers: bool = False,
    progress: bool = True,
    loaded: LoadedModel | None = None,
) -> dict[str, Any]:
    """Benchmarks plain vs speculative decoding on a jsonl prompt file; returns the JSON report (a dict).

    `loaded` reuses an already loaded model (then `model`, `dtype` and `device` are taken from it).
    """
    from tqdm import tqdm

    if speculative_config is None:
        speculative_config = dict(DEFAULT_SPECULATIVE_CONFIG)
    if isinstance(speculative_config, dict):
        speculative_config = SpeculativeConfig.from_dict(speculative_config)
    if warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {warmup}")
    params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed)
    questions = load_questions(prompts, limit=limit, categories=categories)

    if loaded is None:
        loaded = load_model(model, dtype=dtype, device=device)
    plain = LLM(loaded=loaded)
    spec = LLM(loaded=loaded, speculative_config=speculative_config)
    tokenizer = loaded.tokenizer
    hf = _transformers_baseline(loaded, speculative_config, plain, max_new_tokens) if include_transformers else None
    torch.manual_seed(seed)

    for q in questions[:warmup]:
        ids = render_prompt(tokenizer, q.turns[:1], [])
        plain.generate([{"prompt_token_ids": ids}], params)
        spec.generate([{"prompt_token_ids": ids}], params)
        for mode in MODES if hf is not None else ():
            hf.generate(ids, mode)

    results: list[PromptResult] = []
    total = sum(len(q.turns) for q in questions)
    with tqdm(total=total, desc="bench", unit="turn", disable=not progress, dynamic_ncols=True) as bar:
        for q in questions:
            results.extend(_run_question(q, plain, spec, hf, params, bar))
            base = sum(r.baseline_seconds for r in results)
            fast = sum(r.speculative_seconds for r in results)
            bar.set_postfix(speedup=f"{base / fast:.2f}x" if fast else "-", identical=sum(r.identical for r in results))

    diag_runtime = loaded.new_runtime()
    for r in results:
        r.divergence = diagnose(diag_runtime, r.prompt_ids, r.baseline_ids, r.speculative_ids)
        for mode, (ids, _) in r.transformers.items():
            r.transformers_divergence[mode] = diagnose(diag_runtime, r.prompt_ids, r.baseline_ids, ids)

    transformers = None
    if hf is not None:
        transformers = summarize_rows(
            [r.transformers for r in results],
            [r.baseline_ids for r in results],
            plain_seconds=sum(r.baseline_seconds for r in results),
            plain_tokens=sum(len(r.baseline_ids) for r in results),
            baseline=hf,
        )
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
    )


def _run_question(
    q: Question, plain: LLM, spec: LLM, hf: TransformersBaseline | None, params: SamplingParams, bar: Any
) -> list[PromptResult]:
    answers: list[str] = []
    out = []
    for t in range(len(q.turns)):
        prompt = render_prompt(plain.tokenizer, q.turns[: t + 1], answers)
        base_ids, base_text, _, base_s = _timed_generate(plain, prompt, params)
        spec_ids, _, spec_stats, spec_s = _timed_generate(spec, prompt, params)
        hf_runs = {mode: hf.generate(prompt, mode) for mode in MODES} if hf is not None else {}
        answers.append(base_text)
        out.append(
            PromptResult(
                question_id=q.question_id, category=q.category, turn=t + 1, prompt_ids=prompt,
                baseline_ids=list(base_ids), speculative_ids=list(spec_ids), baseline_seconds=base_s,
                speculative_seconds=spec_s, speculative_stats=spec_stats, transformers=hf_runs,
            )
        )
        bar.update(1)
    return out
