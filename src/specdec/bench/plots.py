"""`specdec bench --plot DIR`: PNG figures drawn from the bench's JSON report (a fresh run or saved files).

Figures, each written only when the report holds what it needs:
- `acceptance_per_position.png`: per speculative run, the share of steps that drafted a token at position i
  whose token i was accepted (`overall.acceptance_rate_per_position`);
- `speedup_by_category.png`: per run, the speedup over plain decoding in each prompt category and overall;
- `tokens_per_second_vs_k.png`: where several runs differ only in `num_speculative_tokens` (a K sweep),
  speculative tokens/s against K, with plain decoding's tokens/s beside it;
- `batch_size.png`: a `--batch-size` report's throughput and speedup against batch size.

Accepted report shapes: one run (`overall`, `per_category`), several configs in one run (`runs`), quantized
targets (`targets`), and batched (`rows`). Several reports may be given; their runs are pooled, and the
figure titles then say that tok/s comes from different runs (this machine's speed drifts between runs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACCEPTANCE_PNG = "acceptance_per_position.png"
SPEEDUP_PNG = "speedup_by_category.png"
SWEEP_PNG = "tokens_per_second_vs_k.png"
BATCH_PNG = "batch_size.png"


@dataclass(frozen=True)
class Run:
    """One speculative config's report (the bench's single-run shape), with where it came from."""

    report: dict[str, Any]
    source: str  # report file (or "this run"), for titles when runs are pooled
    prefix: str = ""  # e.g. the quantization of a quantized-targets report


def runs_of(report: dict[str, Any], source: str) -> tuple[list[Run], list[dict[str, Any]]]:
    """(speculative runs, batched reports) held by one bench report, whatever its shape."""
    if "rows" in report and "batch_sizes" in report:
        return [], [report]
    if "targets" in report:
        runs: list[Run] = []
        for target in report["targets"]:
            inner, _ = runs_of(target["report"], source)
            quant = target.get("quantization") or "bf16"
            runs += [Run(r.report, source, f"{quant}: ") for r in inner]
        return runs, []
    if "runs" in report:
        return [Run(_checked(r, source), source) for r in report["runs"]], []
    return [Run(_checked(report, source), source)], []


def _checked(run: Any, source: str) -> dict[str, Any]:
    ok = (isinstance(run, dict) and isinstance(run.get("overall"), dict) and "speedup" in run["overall"]
          and isinstance(run.get("speculative_config"), dict))
    if not ok:
        raise ValueError(f"{source}: not a `specdec bench` JSON report (needs 'overall' with 'speedup' and "
                         "'speculative_config', or 'runs', 'targets' or 'rows' of such reports)")
    return run


def load_reports(paths: Sequence[str | Path]) -> tuple[list[Run], list[dict[str, Any]]]:
    runs: list[Run] = []
    batched: list[dict[str, Any]] = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"--from-report: no such file {str(path)!r}")
        try:
            report = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"--from-report: {path} is not JSON ({exc})") from exc
        if not isinstance(report, dict):
            raise ValueError(f"{path}: not a `specdec bench` JSON report (a JSON object)")
        more_runs, more_batched = runs_of(report, path.name)
        runs += more_runs
        batched += more_batched
    return runs, batched


def config_label(config: dict[str, Any], with_model: bool = False) -> str:
    """A short legend label: method, K, tree shape, threshold (and the drafter when asked)."""
    method = config.get("method", "?")
    parts = [method]
    if with_model and isinstance(config.get("model"), str):
        parts.append(Path(config["model"]).name)
    k = config.get("num_speculative_tokens")
    if k == "auto":
        parts.append(f"K=auto<={config.get('max_num_speculative_tokens')}")
    elif k is not None:
        parts.append(f"K={k}")
    top_k = config.get("tree_top_k")
    if isinstance(top_k, int) and top_k > 1:
        parts.append(f"tree top-k {top_k}, {config.get('tree_num_draft_tokens')} nodes")
    elif method == "medusa":
        parts.append(f"tree {config.get('tree_num_draft_tokens')} nodes")
    if config.get("confidence_threshold"):
        parts.append(f"thr {config['confidence_threshold']}")
    if method == "hybrid" and isinstance(config.get("fallback"), dict):
        parts.append(f"else {config_label(config['fallback'])}")
    return " ".join(parts)


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Labels unique within the figure: the drafter is named where one method ran with several drafters."""
    models: dict[str, set[str]] = {}
    for r in runs:
        cfg = r.report["speculative_config"]
        models.setdefault(cfg.get("method"), set()).add(str(cfg.get("model")))
    labels = []
    for r in runs:
        cfg = r.report["speculative_config"]
        labels.append(r.prefix + config_label(cfg, with_model=len(models[cfg.get("method")]) > 1))
    seen: dict[str, int] = {}
    out = []
    for label in labels:  # two runs of one config (e.g. from two reports) stay apart
        seen[label] = seen.get(label, 0) + 1
        out.append(label if labels.count(label) == 1 else f"{label} ({seen[label]})")
    return out


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def _colors(n: int) -> list[Any]:
    """Distinct colours for n runs: matplotlib's 10-colour cycle repeats from the 11th run on."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _title(runs: Sequence[Run]) -> str:
    first = runs[0].report
    sources = sorted({r.source for r in runs})
    origin = sources[0] if len(sources) == 1 else f"{len(sources)} reports (tok/s from different runs)"
    return (f"{first.get('model', '?')}, {first.get('max_new_tokens', '?')} new tokens, "
            f"temperature {first.get('temperature', '?')}: {origin}")


def plot_acceptance(runs: Sequence[Run], path: Path) -> bool:
    shown = [(label, r) for label, r in zip(run_labels(runs), runs)
             if r.report["overall"].get("acceptance_rate_per_position")]
    if not shown:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for (label, r), color in zip(shown, _colors(len(shown))):
        rates = r.report["overall"]["acceptance_rate_per_position"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label, color=color)
    ax.set_xlabel("draft position (depth in the draft)")
    ax.set_ylabel("accepted / drafted at that position")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    _finish(plt, fig, ax, runs, path)
    return True


def _finish(plt: Any, fig: Any, ax: Any, runs: Sequence[Run], path: Path) -> None:
    """The legend beside the axes, the runs' title, the file written and the figure freed."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(_title(runs), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup_by_category(runs: Sequence[Run], path: Path) -> bool:
    categories = list(dict.fromkeys(c for r in runs for c in r.report.get("per_category", {})))
    if not categories:
        return False
    groups = [*categories, "overall"]
    labels = run_labels(runs)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(min(16.0, 6 + 0.12 * len(groups) * len(runs)), 5.2))
    width = 0.8 / len(runs)
    colors = _colors(len(runs))
    for i, (label, r) in enumerate(zip(labels, runs)):
        per = r.report.get("per_category", {})
        values = [per.get(c, {}).get("speedup", float("nan")) for c in categories] + [r.report["overall"]["speedup"]]
        ax.bar([g + (i - (len(runs) - 1) / 2) * width for g in range(len(groups))], values, width, label=label,
               color=colors[i])
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_ylabel("speedup over plain decoding")
    ax.grid(axis="y", alpha=0.3)
    _finish(plt, fig, ax, runs, path)
    return True


def k_sweeps(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by everything but their fixed K; only groups with two or more K values, sorted by K."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        cfg = dict(r.report["speculative_config"])
        k = cfg.pop("num_speculative_tokens", None)
        if not isinstance(k, int) or isinstance(k, bool):
            continue  # "auto" chooses K itself
        key = r.prefix + json.dumps(cfg, sort_keys=True)
        groups.setdefault(key, []).append(r)
    out = {}
    for key, members in groups.items():
        if len({m.report["speculative_config"]["num_speculative_tokens"] for m in members}) >= 2:
            members.sort(key=lambda m: m.report["speculative_config"]["num_speculative_tokens"])
            cfg = dict(members[0].report["speculative_config"])
            cfg.pop("num_speculative_tokens")
            label = members[0].prefix + config_label(cfg, with_model=True)
            if label in out:  # the short label hides the setting that differs: spell the config out
                label += " (" + ", ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("method", "model")) + ")"
            out[label] = members
    return out


def plot_k_sweep(runs: Sequence[Run], path: Path) -> bool:
    sweeps = k_sweeps(runs)
    if not sweeps:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for n, (label, members) in enumerate(sweeps.items()):
        ks = [m.report["speculative_config"]["num_speculative_tokens"] for m in members]
        color = f"C{n}"
        ax.plot(ks, [m.report["overall"]["speculative_tokens_per_second"] for m in members], marker="o",
                color=color, label=label)
        ax.plot(ks, [m.report["overall"]["baseline_tokens_per_second"] for m in members], ls="--", color=color,
                alpha=0.6, label=f"plain decoding (beside {label})")
    ax.set_xlabel("num_speculative_tokens (K)")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _finish(plt, fig, ax, runs, path)
    return True


def write_plots(runs: Sequence[Run], batched: Sequence[dict[str, Any]], out_dir: str | Path) -> dict[str, str | None]:
    """Writes every figure the reports allow into `out_dir`; returns file name -> path written, or None where
    the reports held nothing for that figure (e.g. no K sweep)."""
    from specdec.bench.batched import plot_batch_bench

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--plot: {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str | None] = {}
    if runs:
        for name, draw in ((ACCEPTANCE_PNG, plot_acceptance), (SPEEDUP_PNG, plot_speedup_by_category),
                           (SWEEP_PNG, plot_k_sweep)):
            written[name] = str(out_dir / name) if draw(runs, out_dir / name) else None
    for i, report in enumerate(batched):
        name = BATCH_PNG if len(batched) == 1 else f"batch_size_{i + 1}.png"
        plot_batch_bench(report, out_dir / name)
        written[name] = str(out_dir / name)
    return written
