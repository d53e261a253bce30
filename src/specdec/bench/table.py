"""The human-readable end of `specdec bench`: rich tables built from the JSON report."""

from __future__ import annotations

import json

from typing import Any

from rich.console import Console
from rich.table import Table

MAX_MISMATCH_ROWS = 20
PEERS = {"transformers": "transformers generate", "llama_cpp": "llama.cpp"}  # report key -> name in titles


def notes(report: dict[str, Any]) -> list[str]:
    out = []
    if not report["exact_runtime"]:
        out.append(
            f"runtime is NOT bit-exact ({report['dtype']} on {report['device']}, or the transformers fallback): "
            "matmul rounding there depends on how many tokens share a forward, so plain and speculative outputs "
            "may part at near-ties; each divergence is listed with the target's logit margin"
        )
    if report["temperature"] > 0:
        out.append(
            f"temperature {report['temperature']} > 0 (seed {report['seed']}): outputs are sampled, so token "
            "identity is not expected and mismatches are not failures; speedup compares different outputs"
        )
    if report["temperature"] > 0 and "transformers" in report:
        out.append("transformers rows decode greedily (do_sample=False) whatever the temperature")
    if report["temperature"] > 0 and "llama_cpp" in report:
        out.append("llama.cpp rows decode greedily (temp=0) whatever the temperature")
    others = {row["compared_with"] for row in report.get("llama_cpp", {}).values()} - {"gguf"}
    if others:
        out.append(
            f"llama.cpp runs the GGUF file's quantized weights, ours {', '.join(sorted(others))}: identical outputs "
            "are not expected (with --quantization gguf ours runs the same weights)"
        )
    if report["prompt_format"] == "question_answer":
        out.append(
            "no chat template: prompts rendered as 'Question: ...\\nAnswer:', later turns append the plain run's answer"
        )
    return out


def _main_table(report: dict[str, Any]) -> Table:
    cfg = report["speculative_config"]
    title = (
        f"specdec bench: {report['model']} ({report['dtype']}, {report['device']}), "
        f"{cfg['method']} {cfg}, max_new_tokens {report['max_new_tokens']}, temperature {report['temperature']}"
    )
    table = Table(title=title, caption="\n".join(notes(report)) or None, caption_justify="left")
    for name, justify in [
        ("category", "left"), ("prompts", "right"), ("tokens", "right"), ("plain s", "right"),
        ("spec s", "right"), ("plain tok/s", "right"), ("spec tok/s", "right"), ("speedup", "right"),
        ("decode speedup", "right"), ("mean acc len", "right"), ("acc rate", "right"), ("identical", "right"),
    ]:
        table.add_column(name, justify=justify)

    def row(name: str, s: dict[str, Any], **style: Any) -> None:
        table.add_row(
            name, str(s["prompts"]), str(s["new_tokens"]), f"{s['baseline_seconds']:.2f}",
            f"{s['speculative_seconds']:.2f}", f"{s['baseline_tokens_per_second']:.1f}",
            f"{s['speculative_tokens_per_second']:.1f}", f"{s['speedup']:.2f}x",
            f"{s.get('decode_speedup', 0.0):.2f}x", f"{s['mean_acceptance_length']:.2f}", f"{s['acceptance_rate']:.3f}",
            f"{s['identical']}/{s['prompts']} ({s['identical_fraction']:.0%})", **style,
        )

    for name, s in report["per_category"].items():
        row(name, s)
    table.add_section()
    row("overall", report["overall"], style="bold")
    return table


def _peers_table(report: dict[str, Any]) -> Table:
    names = " and ".join(name for key, name in PEERS.items() if key in report)
    table = Table(title=f"{names} on the same prompts (speedup relative to our plain decoding)")
    for name in ["decoder", "tokens", "seconds", "tok/s", "speedup", "= our plain", "= own greedy"]:
        table.add_column(name, justify="left" if name == "decoder" else "right")
    o = report["overall"]
    table.add_row(
        "specdec plain", str(o["new_tokens"]), f"{o['baseline_seconds']:.2f}",
        f"{o['baseline_tokens_per_second']:.1f}", "1.00x", "", "",
    )
    table.add_row(
        f"specdec {report['method']}", str(o["speculative_new_tokens"]), f"{o['speculative_seconds']:.2f}",
        f"{o['speculative_tokens_per_second']:.1f}", f"{o['speedup']:.2f}x", f"{o['identical']}/{o['prompts']}", "",
    )
    for key in PEERS:
        for row in report.get(key, {}).values():
            n = row["prompts"]
            table.add_row(
                row["label"], str(row["new_tokens"]), f"{row['seconds']:.2f}", f"{row['tokens_per_second']:.1f}",
                f"{row['speedup_vs_plain']:.2f}x", f"{row['identical_to_plain']}/{n}",
                f"{row[f'identical_to_{key}_greedy']}/{n}",
            )
    return table


def _mismatches(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(decoder, per-prompt entry, divergence record) for every output that differs from our plain output."""
    out = []
    for p in report["per_prompt"]:
        if not p["identical"]:
            out.append((f"specdec {report['method']}", p, p))
    for key in PEERS:
        for mode, row in report.get(key, {}).items():
            for p in report["per_prompt"]:
                t = p.get(key, {}).get(mode)
                if t is not None and not t["identical_to_plain"]:
                    out.append((row["label"], p, t))
    return out


def _mismatch_table(report: dict[str, Any]) -> Table | None:
    rows = _mismatches(report)
    if not rows:
        return None
    table = Table(
        title="outputs that differ from our plain decoding: first divergence, and our target's top-1 minus top-2 "
        "logit there (small: a near-tie, numerical noise; large under greedy: a bug)"
    )
    columns = ["decoder", "question", "category", "turn", "first divergence", "logit margin", "plain tok", "other tok"]
    for name in columns:
        table.add_column(name, justify="left" if name == "decoder" else "right")
    for decoder, p, d in rows[:MAX_MISMATCH_ROWS]:
        t = d["divergence_tokens"] or {}
        keys = ("speculative_token", *(f"{key}_token" for key in PEERS))
        other = next((t[k] for k in keys if k in t), None)
        margin = d["logit_margin"]
        table.add_row(
            decoder, str(p["question_id"]), p["category"], str(p["turn"]), str(d["first_divergence"]),
            "-" if margin is None else f"{margin:.4f}", str(t.get("baseline_token")), str(other),
        )
    if len(rows) > MAX_MISMATCH_ROWS:
        table.caption = f"... {len(rows) - MAX_MISMATCH_ROWS} more in the JSON report"
    return table


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(_main_table(report))
    if any(key in report for key in PEERS):
        console.print(_peers_table(report))
    mismatches = _mismatch_table(report)
    if mismatches is not None:
        console.print(mismatches)


def print_comparison(rows: list[dict[str, Any]], console: Console | None = None) -> None:
    """Every method of one run side by side (each against the same plain runs)."""
    console = console or Console()
    table = Table(title="methods compared (same plain runs, one process)")
    for col in ("speculative config", "speedup", "decode speedup", "mean acc. len", "acc. rate", "acceptance per position",
                "identical"):
        table.add_column(col, justify="left" if col.startswith("spec") or col.startswith("acceptance") else "right")
    for r in rows:
        per_pos = ", ".join(f"{a:.2f}" for a in (r.get("acceptance_rate_per_position") or []))
        table.add_row(json.dumps(r["speculative_config"]), f"{r['speedup']:.2f}x",
                      f"{r.get('decode_speedup', 0.0):.2f}x", f"{r['mean_acceptance_length']:.2f}",
                      f"{r['acceptance_rate']:.3f}", per_pos, f"{r['identical_fraction']:.3f}")
    console.print(table)
