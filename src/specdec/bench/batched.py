"""`specdec bench --batch-size 1,4,16,32`: offline throughput with all prompts submitted and at most B running.

Per batch size B, plain decoding and every speculative config run the same prompts (first turns; for a
question with given `answers`, its last turn after them) through the continuous-batching scheduler, back
to back. Reported per B and mode: output tokens/s, the speedup over plain at the same B, mean acceptance
length, per-request latency (submission to last token) p50/p90, the fraction of outputs identical to
batch-1 plain decoding, and the draft lengths the policy chose. The batch-1 plain run is always made
first: it is the reference every output is compared with.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.api import LLM
from specdec.bench.prompts import first_prompt, load_questions
from specdec.engine.stats import SpecDecodingStats
from specdec.models.loading import DEFAULT_MODEL, LoadedModel, load_model
from specdec.sampling_params import SamplingParams
from specdec.speculative_config import SpeculativeConfig


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_offline(llm: LLM, prompts: Sequence[list[int]], params: SamplingParams, batch_size: int,
                progress: Any = None) -> dict[str, Any]:
    """All prompts submitted at once, at most `batch_size` running; returns outputs, latencies and stats."""
    scheduler = llm.new_scheduler(max_num_seqs=batch_size)
    start = time.perf_counter()
    ids = [scheduler.add(p, params) for p in prompts]
    scheduler.closed = True
    done: dict[str, float] = {}
    last: dict[str, Any] = {}
    while scheduler.has_unfinished:
        for rid, out in scheduler.step().items():
            last[rid] = out
            if out.finish is not None:
                done[rid] = time.perf_counter() - start
                if progress is not None:
                    progress.update(1)
    seconds = time.perf_counter() - start
    stats = SpecDecodingStats()
    for rid in ids:
        stats.merge(last[rid].stats)
    tokens = [list(last[rid].checker.output) for rid in ids]
    latencies = [done[rid] for rid in ids]
    return {"seconds": seconds, "tokens": tokens, "latencies": latencies, "stats": stats}


def _row(mode: str, run: dict[str, Any], reference: list[list[int]], plain_tps: float | None) -> dict[str, Any]:
    n = sum(len(t) for t in run["tokens"])
    tps = n / run["seconds"] if run["seconds"] else 0.0
    stats: SpecDecodingStats = run["stats"]
    identical = sum(a == b for a, b in zip(run["tokens"], reference))
    return {
        "mode": mode,
        "output_tokens": n,
        "seconds": round(run["seconds"], 3),
        "output_tokens_per_second": round(tps, 2),
        "speedup": round(tps / plain_tps, 3) if plain_tps else 1.0,
        "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "latency_p50_s": round(_percentile(run["latencies"], 0.5), 3),
        "latency_p90_s": round(_percentile(run["latencies"], 0.9), 3),
        "identical": identical,
        "identical_fraction": round(identical / len(reference), 4) if reference else 1.0,
        "mean_chosen_draft_length": round(stats.mean_chosen_draft_length, 3),
        "chosen_draft_lengths": list(stats.chosen_draft_lengths),
    }


def config_label(config: SpeculativeConfig) -> str:
    d = config.to_dict()
    k = d.get("num_speculative_tokens")
    extra = ", by batch size" if config.by_batch_size else ""
    model = d.get("model")
    return f"{config.method}" + (f" {Path(str(model)).name}" if model else "") + f" (k={k}{extra})"


def run_batch_bench(
    prompts: str | Path,
    *,
    batch_sizes: Sequence[int],
    model: str = DEFAULT_MODEL,
    speculative_config: Sequence[dict[str, Any] | SpeculativeConfig] = ({"method": "ngram"},),
    dtype: str = "bfloat16",
    device: str | None = None,
    quantization: str | None = None,
    limit: int | None = None,
    categories: Sequence[str] | None = None,
    per_category: int | None = None,
    max_new_tokens: int = 128,
    warmup: int = 1,
    progress: bool = True,
    loaded: LoadedModel | None = None,
) -> dict[str, Any]:
    from tqdm import tqdm

    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"--batch-size needs positive sizes, got {list(batch_sizes)}")
    target = (loaded.quantization, loaded.device) if loaded is not None else (quantization, device)
    configs = [SpeculativeConfig.from_dict(c, *target) if isinstance(c, dict) else c
               for c in speculative_config]
    questions = load_questions(prompts, limit=limit, categories=categories, per_category=per_category)
    loaded = loaded or load_model(model, dtype=dtype, device=device, quantization=quantization)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    prompt_ids = [first_prompt(loaded.tokenizer, q) for q in questions]
    largest = max(batch_sizes)
    plain = LLM(loaded=loaded, max_num_seqs=largest)
    specs = [LLM(loaded=loaded, speculative_config=c, max_num_seqs=largest) for c in configs]
    warm = SamplingParams(temperature=0.0, max_tokens=8)
    for llm in [plain, *specs][: None if warmup else 0]:
        llm.generate([{"prompt_token_ids": p} for p in prompt_ids[:warmup]], warm)  # also measures auto's curve
    total = len(prompt_ids) * (1 + len(batch_sizes) * (1 + len(configs)))
    bar = tqdm(total=total, desc="batched bench", disable=not progress)
    reference = run_offline(plain, prompt_ids, params, 1, bar)
    rows = []
    for b in batch_sizes:
        base = reference if b == 1 else run_offline(plain, prompt_ids, params, b, bar)
        plain_row = _row("plain", base, reference["tokens"], None)
        rows.append({"batch_size": b, **plain_row})
        for config, llm in zip(configs, specs):
            run = run_offline(llm, prompt_ids, params, b, bar)
            rows.append({"batch_size": b, **_row(config_label(config), run, reference["tokens"],
                                                 plain_row["output_tokens_per_second"])})
    bar.close()
    policies = {config_label(c): llm.draft_length_policy.describe() for c, llm in zip(configs, specs)}
    return {
        "model": loaded.name,
        "prompts": str(prompts),
        "num_prompts": len(prompt_ids),
        "max_new_tokens": max_new_tokens,
        "batch_sizes": list(batch_sizes),
        "configs": [c.to_dict() for c in configs],
        "policies": policies,
        "rows": rows,
        "reference_token_ids": reference["tokens"],  # batch-1 plain: what peers' outputs are checked against
    }


def plot_batch_bench(report: dict[str, Any], path: str | Path) -> None:
    """Output tokens/s against batch size per mode, and the speedup over plain, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r["mode"] for r in report["rows"]))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for n, mode in enumerate(modes):
        rows = [r for r in report["rows"] if r["mode"] == mode]
        sizes = [r["batch_size"] for r in rows]
        color = f"C{n}"  # one colour per mode in both panels
        ax1.plot(sizes, [r["output_tokens_per_second"] for r in rows], marker="o", label=mode, color=color)
        if mode != "plain":
            ax2.plot(sizes, [r["speedup"] for r in rows], marker="o", label=mode, color=color)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(report["batch_sizes"], [str(b) for b in report["batch_sizes"]])
        ax.set_xlabel("batch size (requests running at once)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("output tokens/s")
    ax2.set_ylabel("speedup over plain at the same batch size")
    ax2.axhline(1.0, color="grey", lw=1)
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.suptitle(f"{report['model']}: {report['num_prompts']} prompts, {report['max_new_tokens']} new tokens, greedy",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_batch_bench(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"offline batches: {report['num_prompts']} prompts, {report['max_new_tokens']} new tokens")
    for col in ("B", "mode", "tok/s", "speedup", "mean acc. len", "p50 s", "p90 s", "identical", "mean k chosen"):
        table.add_column(col, justify="right" if col not in ("mode",) else "left")
    for r in report["rows"]:
        table.add_row(str(r["batch_size"]), r["mode"], f"{r['output_tokens_per_second']:.1f}",
                      f"{r['speedup']:.2f}x", f"{r['mean_acceptance_length']:.2f}", f"{r['latency_p50_s']:.1f}",
                      f"{r['latency_p90_s']:.1f}", f"{r['identical']}/{report['num_prompts']}",
                      f"{r['mean_chosen_draft_length']:.2f}")
    console.print(table)
