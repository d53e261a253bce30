"""`specdec bench --quantization none,int8,int4,gguf`: the same prompts on each quantized target, plain and
speculative, in one process; plain speed against the first target's (bf16 with "none")."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from specdec.bench.runner import comparison_row, run_bench
from specdec.models.loading import load_model
from specdec.quantization import check_mode
from specdec.quantization.apply import quantized_bytes


def parse_quantizations(text: str | None) -> list[str | None]:
    """"none,int8,gguf" -> [None, "int8", "gguf"]; None -> [None]."""
    if text is None:
        return [None]
    out = [None if q.strip() in ("", "none") else check_mode(q.strip()) for q in text.split(",")]
    if len(set(out)) != len(out):
        raise ValueError(f"--quantization lists a target twice: {text!r}")
    return out


def run_quantized_bench(prompts: str, quantizations: Sequence[str | None], *, model: str, dtype: str,
                        device: str | None, **bench_args: Any) -> dict[str, Any]:
    """One run_bench per quantized target (loaded one at a time), and the cross-target rows."""
    targets = []
    for q in quantizations:
        loaded = load_model(model, dtype=dtype, device=device, quantization=q)
        weights = quantized_bytes(loaded.decoder) if loaded.decoder is not None else {}
        report = run_bench(prompts, loaded=loaded, **bench_args)
        rows = report["comparison"] if "runs" in report else [comparison_row(report)]
        targets.append({"quantization": q or "none", "weight_bytes_per_step": sum(weights.values()),
                        "report": report, "comparison": rows})
        del loaded
        gc.collect()
    base = targets[0]["comparison"][0]["baseline_tokens_per_second"]
    table = []
    for t in targets:
        plain = t["comparison"][0]["baseline_tokens_per_second"]
        for row in t["comparison"]:
            table.append({"quantization": t["quantization"], "weight_bytes_per_step": t["weight_bytes_per_step"],
                          "plain_tokens_per_second": plain, "plain_vs_first": plain / base,
                          "speculative_vs_first_plain": row["speculative_tokens_per_second"] / base, **row})
    return {"targets": targets, "quantized_comparison": table}


def print_quantized(rows: list[dict[str, Any]], console: Console | None = None) -> None:
    console = console or Console()
    first = rows[0]["quantization"] if rows else "none"
    table = Table(title=f"quantized targets (one process; ratios against {first} plain)")
    for col in ("target", "weights MB/step", "plain tok/s", f"plain vs {first}", "speculative config", "speedup",
                "decode speedup", f"spec. vs {first} plain", "mean acc. len", "identical"):
        table.add_column(col, justify="left" if col in ("target", "speculative config") else "right")
    for r in rows:
        table.add_row(r["quantization"], f"{r['weight_bytes_per_step'] / 1e6:.0f}", f"{r['plain_tokens_per_second']:.1f}",
                      f"{r['plain_vs_first']:.2f}x", r["speculative_config"]["method"], f"{r['speedup']:.2f}x",
                      f"{r.get('decode_speedup', 0.0):.2f}x", f"{r['speculative_vs_first_plain']:.2f}x",
                      f"{r['mean_acceptance_length']:.2f}", f"{r['identical_fraction']:.3f}")
    console.print(table)
