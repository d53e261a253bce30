"""Benchmark results: per-prompt records, overall/per-category aggregates, the JSON report.

Aggregates (`overall` and each `per_category` entry) are sums over the same prompts in both modes:
speedup = baseline_seconds / speculative_seconds (wall time, plain over speculative; under greedy both
generate the same tokens), tokens_per_second = that mode's new tokens / its seconds, acceptance numbers
from the merged SpecDecodingStats of the speculative runs (mean acceptance length = tokens per target
forward, see engine/stats.py). `new_tokens` counts the baseline's tokens, `speculative_new_tokens` the
speculative run's (equal when every prompt is identical). median_prompt_speedup, the median of the
per-prompt ratios, shows whether one noisy prompt dominates the sums. decode_speedup leaves out each
mode's prefill (prompt forward, and the drafter's reading of the prompt): with prompts of thousands of
tokens and 128 new ones the shared prefill is much of the wall time, and speedup alone hides the decoding.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec.bench.divergence import Divergence
from specdec.engine.stats import SpecDecodingStats


@dataclass
class PromptResult:
    question_id: int | str
    category: str
    turn: int  # 1-based
    prompt_ids: list[int]
    baseline_ids: list[int]
    speculative_ids: list[int]
    baseline_seconds: float
    speculative_seconds: float
    speculative_stats: SpecDecodingStats
    baseline_prefill_seconds: float = 0.0  # prompt forward to first token (the speculative one: in its stats)
    divergence: Divergence | None = None
    transformers: dict[str, tuple[list[int], float]] = field(default_factory=dict)  # mode -> (ids, seconds)
    transformers_divergence: dict[str, Divergence | None] = field(default_factory=dict)  # mode -> vs baseline
    llama_cpp: dict[str, tuple[list[int], float]] = field(default_factory=dict)  # likewise for llama.cpp
    llama_cpp_divergence: dict[str, Divergence | None] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return self.baseline_ids == self.speculative_ids


def _rate(num: float, den: float, digits: int = 4) -> float:
    return round(num / den, digits) if den else 0.0


def aggregate(results: Sequence[PromptResult]) -> dict[str, Any]:
    stats = SpecDecodingStats()
    for r in results:
        stats.merge(r.speculative_stats)
    base_s = sum(r.baseline_seconds for r in results)
    spec_s = sum(r.speculative_seconds for r in results)
    base_tokens = sum(len(r.baseline_ids) for r in results)
    spec_tokens = sum(len(r.speculative_ids) for r in results)
    identical = sum(r.identical for r in results)
    per_prompt = [r.baseline_seconds / r.speculative_seconds for r in results if r.speculative_seconds]
    base_decode = base_s - sum(r.baseline_prefill_seconds for r in results)
    spec_decode = spec_s - stats.prefill_seconds
    # seconds to the microsecond: a short run's ratios must follow from the rounded figures
    return {
        "prompts": len(results),
        "new_tokens": base_tokens,
        "speculative_new_tokens": spec_tokens,
        "baseline_seconds": round(base_s, 6),
        "speculative_seconds": round(spec_s, 6),
        "speedup": _rate(base_s, spec_s),
        # robust to one prompt hit by machine noise (the sum-based speedup above is the headline number)
        "median_prompt_speedup": round(statistics.median(per_prompt), 4) if per_prompt else 0.0,
        "baseline_prefill_seconds": round(base_s - base_decode, 6),
        "speculative_prefill_seconds": round(stats.prefill_seconds, 6),
        "decode_speedup": _rate(base_decode, spec_decode),
        "baseline_tokens_per_second": _rate(base_tokens, base_s, 2),
        "speculative_tokens_per_second": _rate(spec_tokens, spec_s, 2),
        "mean_acceptance_length": round(stats.mean_acceptance_length, 4),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "accepted_per_position": list(stats.accepted_per_position),
        "acceptance_rate_per_position": [round(x, 4) for x in stats.acceptance_rate_per_position],
        "identical": identical,
        "identical_fraction": _rate(identical, len(results)),
        "mismatches": len(results) - identical,
    }


def per_category(results: Sequence[PromptResult]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[PromptResult]] = {}
    for r in results:
        groups.setdefault(r.category, []).append(r)
    return {name: aggregate(group) for name, group in groups.items()}


def prompt_entry(r: PromptResult) -> dict[str, Any]:
    d = r.divergence
    entry = {
        "question_id": r.question_id,
        "category": r.category,
        "turn": r.turn,
        "prompt_tokens": len(r.prompt_ids),
        "new_tokens": {"baseline": len(r.baseline_ids), "speculative": len(r.speculative_ids)},
        "seconds": {"baseline": round(r.baseline_seconds, 4), "speculative": round(r.speculative_seconds, 4)},
        "speedup": _rate(r.baseline_seconds, r.speculative_seconds),
        "prefill_seconds": {"baseline": round(r.baseline_prefill_seconds, 4),
                            "speculative": round(r.speculative_stats.prefill_seconds, 4)},
        "decode_speedup": _rate(r.baseline_seconds - r.baseline_prefill_seconds,
                                r.speculative_seconds - r.speculative_stats.prefill_seconds),
        "mean_acceptance_length": round(r.speculative_stats.mean_acceptance_length, 4),
        "acceptance_rate": round(r.speculative_stats.acceptance_rate, 4),
        "identical": r.identical,
        "first_divergence": d.position if d is not None else None,
        "logit_margin": round(d.logit_margin, 4) if d is not None else None,
        "divergence_tokens": d.to_dict() if d is not None else None,
    }
    if r.transformers:
        entry["transformers"] = _peer_entries(r.transformers, r.transformers_divergence, r.baseline_ids, "transformers")
    if r.llama_cpp:
        entry["llama_cpp"] = _peer_entries(r.llama_cpp, r.llama_cpp_divergence, r.baseline_ids, "llama_cpp")
    return entry


def _peer_entries(runs: dict[str, tuple[list[int], float]], divergences: dict[str, Divergence | None],
                  baseline_ids: list[int], peer: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mode, (ids, seconds) in runs.items():
        d = divergences.get(mode)
        out[mode] = {
            "new_tokens": len(ids),
            "seconds": round(seconds, 4),
            "identical_to_plain": list(ids) == baseline_ids,
            # against OUR plain output; the margin is our target's, at that position
            "first_divergence": d.position if d is not None else None,
            "logit_margin": round(d.logit_margin, 4) if d is not None else None,
            "divergence_tokens": d.to_dict(peer) if d is not None else None,
        }
    return out


def build_report(
    results: Sequence[PromptResult],
    *,
    model: str,
    speculative_config: dict[str, Any],
    dtype: str,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    device: str,
    exact_runtime: bool,
    chat_template: bool,
    transformers: dict[str, Any] | None = None,
    llama_cpp: dict[str, Any] | None = None,
) -> dict[str, Any]:
    report = {
        "model": model,
        "method": speculative_config["method"],
        "speculative_config": speculative_config,
        "dtype": dtype,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "seed": seed,
        "device": device,
        "exact_runtime": exact_runtime,
        "prompt_format": "chat_template" if chat_template else "question_answer",
        "overall": aggregate(results),
        "per_category": per_category(results),
        "per_prompt": [prompt_entry(r) for r in results],
    }
    if transformers is not None:
        report["transformers"] = transformers
    if llama_cpp is not None:
        report["llama_cpp"] = llama_cpp
    return report
