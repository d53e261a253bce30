"""Runs the gate: greedy identity on every case, the sampling check, the acceptance and speedup floors.

One process, one loaded target. Plain decoding runs first (batched, timed), then per speculative config the
same cases (batched, timed) and the sampling check. The report lists every failed check; `passed` is true
when there is none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from specdec.api import LLM
from specdec.bench.batched import config_label
from specdec.bench.prompts import first_prompt
from specdec.check.cases import load_cases
from specdec.check.greedy import GreedyRun, divergences, run_greedy
from specdec.check.sampling import pick_cases, run_sampling_check
from specdec.check.settings import CheckSettings
from specdec.models.loading import LoadedModel, load_model
from specdec.sampling_params import SamplingParams
from specdec.speculative_config import SpeculativeConfig

SAMPLING_OFFSET = 8  # greedy answer tokens kept in a sampling context: sampling starts inside the answer


def run_check(settings: CheckSettings, loaded: LoadedModel | None = None) -> dict[str, Any]:
    problems = settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    configs = [c if isinstance(c, SpeculativeConfig) else SpeculativeConfig.from_dict(dict(c))
               for c in settings.configs]
    cases = load_cases(settings.cases, settings.limit, settings.kinds)
    loaded = loaded or load_model(settings.model, dtype=settings.dtype, device=settings.device,
                                  quantization=settings.quantization)
    prompts = [first_prompt(loaded.tokenizer, c.question()) for c in cases]
    plain_llm = LLM(loaded=loaded, max_num_seqs=settings.batch_size)
    _warm_up(plain_llm, prompts[0])
    plain = run_greedy(plain_llm, prompts, settings.max_new_tokens, settings.batch_size, "plain",
                       settings.progress)
    runtime = loaded.new_runtime()  # the target alone, for margins and exact probabilities
    sampled = pick_cases(cases, prompts, settings.sampling_cases)
    # never the answer's last token: it may be the end of sequence
    contexts = [prompts[i] + plain.tokens[i][: min(SAMPLING_OFFSET, len(plain.tokens[i]) - 1)] for i in sampled]
    runs = []
    for config in configs:
        llm = LLM(loaded=loaded, speculative_config=config, max_num_seqs=settings.batch_size)
        _warm_up(llm, prompts[0])  # also measures "auto"'s cost curve, outside the timed run
        spec = run_greedy(llm, prompts, settings.max_new_tokens, settings.batch_size, config_label(config),
                          settings.progress)
        found = divergences(runtime, loaded.tokenizer, cases, prompts, plain, spec)
        sampling = None
        if contexts:
            sampling = run_sampling_check(llm, runtime, [cases[i] for i in sampled], contexts, settings.samples,
                                          settings.sampling_tokens, settings.seed, settings.progress)
        runs.append(_config_report(config, plain, spec, found, sampling, settings))
    failures = [f"{r['label']}: {f}" for r in runs for f in r["failures"]]
    return {
        "model": loaded.name,
        "dtype": settings.dtype,
        "quantization": settings.quantization,
        "num_cases": len(cases),
        "kinds": dict(Counter(c.kind for c in cases)),
        "max_new_tokens": settings.max_new_tokens,
        "batch_size": settings.batch_size,
        "thresholds": {"min_acceptance": settings.min_acceptance, "min_speedup": settings.min_speedup,
                       "alpha": settings.alpha},
        "plain": {"seconds": round(plain.seconds, 3), "output_tokens": sum(map(len, plain.tokens))},
        "runs": runs,
        "failures": failures,
        "passed": not failures,
    }


def _warm_up(llm: LLM, prompt: list[int]) -> None:
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=8))


def _config_report(config: SpeculativeConfig, plain: GreedyRun, spec: GreedyRun, found: list[dict[str, Any]],
                   sampling: Any, settings: CheckSettings) -> dict[str, Any]:
    stats = spec.stats
    speedup = plain.seconds / spec.seconds if spec.seconds else 0.0
    failures = [f"greedy divergence in {d['id']} ({d['kind']}) at position {d['position']}" for d in found]
    if stats.acceptance_rate < settings.min_acceptance:
        failures.append(f"acceptance rate {stats.acceptance_rate:.3f} < --min-acceptance {settings.min_acceptance}")
    if settings.min_speedup is not None and speedup < settings.min_speedup:
        failures.append(f"speedup {speedup:.2f}x < --min-speedup {settings.min_speedup}")
    warnings, sampling_report = [], None
    if sampling is not None:
        sampling_report = sampling.to_dict(settings.alpha)
        if sampling.p_value < settings.alpha:
            failures.append(f"sampling check: chi-square {sampling.statistic:.1f} on {sampling.df} df, "
                            f"p = {sampling.p_value:.2e} < --alpha {settings.alpha}")
        if not sampling.stats.num_draft_tokens:
            warnings.append("sampling check made no draft: it tested the sampler, not verification")
    return {
        "label": config_label(config),
        "config": config.to_dict(),
        "seconds": round(spec.seconds, 3),
        "speedup": round(speedup, 3),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
        "drafted_tokens": stats.num_draft_tokens,
        "accepted_tokens": stats.num_accepted_tokens,
        "identical": len(spec.tokens) - len(found),
        "divergences": found,
        "sampling": sampling_report,
        "failures": failures,
        "warnings": warnings,
    }
