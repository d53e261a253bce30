"""The gate's report as a rich console table, Markdown and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdec.atomic_write import write_text_atomic

COLUMNS = ("config", "identical", "acceptance", "mean acc. len", "plain s", "spec. s", "speedup", "sampling p",
           "verdict")


def _rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for r in report["runs"]:
        s = r["sampling"]
        sampling = "-" if s is None else f"{s['p_value']:.3g} ({s['drafted_tokens']} drafted)"
        rows.append((r["label"], f"{r['identical']}/{report['num_cases']}", f"{r['acceptance_rate']:.3f}",
                     f"{r['mean_acceptance_length']:.2f}", f"{report['plain']['seconds']:.1f}", f"{r['seconds']:.1f}",
                     f"{r['speedup']:.2f}x", sampling, "FAIL" if r["failures"] else "pass"))
    return rows


def _title(report: dict[str, Any]) -> str:
    return (f"specdec check: {report['model']} ({report['dtype']}), {report['num_cases']} cases, greedy "
            f"{report['max_new_tokens']} new tokens, batch {report['batch_size']}")


def _divergence_line(d: dict[str, Any]) -> str:
    return (f"{d['id']} ({d['kind']}): first difference at token {d['position']}, plain {d['plain_text']!r} vs "
            f"speculative {d['speculative_text']!r}, target's top-2 margin {d['logit_margin']:.3f}, after "
            f"{d['context']!r}")


def print_report(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=_title(report))
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("config", "verdict") else "right")
    for row in _rows(report):
        table.add_row(*row[:-1], f"[red]{row[-1]}[/red]" if row[-1] == "FAIL" else f"[green]{row[-1]}[/green]")
    console.print(table)
    for r in report["runs"]:
        for d in r["divergences"]:
            console.print(f"[red]divergence[/red] {r['label']}: {_divergence_line(d)}", markup=True, highlight=False)
        for w in r["warnings"]:
            console.print(f"[yellow]warning[/yellow] {r['label']}: {w}")
    verdict = "[green]PASSED[/green]" if report["passed"] else "[red]FAILED[/red]: " + "; ".join(report["failures"])
    console.print(verdict, highlight=False)


def to_markdown(report: dict[str, Any]) -> str:
    lines = [f"# {_title(report)}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(report)]
    kinds = ", ".join(f"{k} {n}" for k, n in report["kinds"].items())
    lines += ["", f"Cases by kind: {kinds}."]
    for r in report["runs"]:
        s = r["sampling"]
        if s is not None:
            lines.append(f"\n{r['label']} sampling check: {s['samples_per_case']} samples x {s['tokens_per_sample']} "
                         f"tokens on {', '.join(s['cases'])}: chi-square {s['statistic']} on {s['df']} df, "
                         f"p = {s['p_value']:.3g} (alpha {s['alpha']}), {s['drafted_tokens']} drafted tokens, "
                         f"{s['accepted_tokens']} accepted.")
        lines += [f"- divergence: {_divergence_line(d)}" for d in r["divergences"]]
        lines += [f"- warning: {w}" for w in r["warnings"]]
    lines += ["", "**PASSED**" if report["passed"] else "**FAILED**: " + "; ".join(report["failures"]), ""]
    return "\n".join(lines)


def write_reports(report: dict[str, Any], json_path: str | None, md_path: str | None) -> None:
    for path, text in ((json_path, json.dumps(report, indent=2) + "\n"), (md_path, to_markdown(report))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(Path(path), text)
