"""`specdec drafter info DIR_OR_NAME`: what a drafter is, what it was made for, and the proposal settings it
stores, with the measured figures they were chosen on (its config.json, read only; no model is loaded).

    specdec drafter info gemma-3-270m-eagle3 [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from specdec.drafting.proposal_settings import ENTRY_NAME, default_entry, entry_options, stored_entries
from specdec.drafting.shipped import resolve_drafter

# (label, path in config.json): the shape figures a drafter of any method may carry
SIZE_FIELDS = (
    ("draft layers", ("transformer_layer_config", "num_hidden_layers")),
    ("hidden size", ("transformer_layer_config", "hidden_size")),
    ("hidden size", ("hidden_size",)),
    ("Medusa heads", ("medusa_num_heads",)),
    ("layers per head", ("medusa_num_layers",)),
    ("MTP modules", ("num_nextn_predict_layers",)),
    ("block size", ("block_size",)),
    ("draft vocabulary", ("draft_vocab_size",)),
    ("target layers read", ("eagle_aux_hidden_state_layer_ids",)),
    ("target layers read", ("aux_hidden_state_layer_ids",)),
)


def _get(config: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = config
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _weights(directory: Path) -> dict[str, int] | None:
    """Parameter count and bytes of model.safetensors, from its header only."""
    path = directory / "model.safetensors"
    if not path.is_file():
        return None
    from safetensors import safe_open

    count = 0
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            n = 1
            for dim in f.get_slice(key).get_shape():
                n *= dim
            count += n
    return {"parameters": count, "bytes": path.stat().st_size}


def drafter_info(name_or_path: str) -> dict[str, Any]:
    """The facts `drafter info` prints, as a dict (its --json output)."""
    directory = resolve_drafter(name_or_path)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} is not a drafter directory (no config.json)")
    try:
        config = json.loads(config_path.read_text())
    except ValueError as exc:
        raise ValueError(f"{config_path} is not valid JSON: {exc}") from exc
    method = config.get("speculators_model_type") if isinstance(config, dict) else None
    spec = config.get("speculators_config") if isinstance(config, dict) else None
    if not method or not isinstance(spec, dict):
        raise ValueError(f"{config_path} is not a speculators drafter config (no speculators_model_type or "
                         "speculators_config)")
    sizes: dict[str, Any] = {}
    for label, path in SIZE_FIELDS:
        value = _get(config, path)
        if value is not None and label not in sizes:
            sizes[label] = value
    entries, default = stored_entries(config, bare=True)  # what {"method": ..., "model": NAME} runs here
    chosen = default_entry(entries, default)
    stored = [{"proposal_type": e.get("proposal_type"), **({"name": e[ENTRY_NAME]} if ENTRY_NAME in e else {}),
               "default": e is chosen, "settings": entry_options(e)} for e in entries]
    effective = _effective_config(method, str(name_or_path))
    return {
        "drafter": str(name_or_path), "directory": str(directory), "method": method,
        "architecture": (config.get("architectures") or [None])[0],
        "target": spec.get("verifier", {}), "sizes": sizes, "weights": _weights(directory),
        "proposal_methods": stored, "default_proposal_method": default,
        "effective_config": effective, "tuning": config.get("specdec_tuning"),
    }


def _effective_config(method: str, directory: str) -> dict[str, Any] | str:
    """What `{"method": method, "model": directory}` resolves to, or why it does not."""
    from specdec.speculative_config import SpeculativeConfig

    try:
        return SpeculativeConfig.from_dict({"method": method, "model": directory}).to_dict()
    except ValueError as exc:
        return f"error: {exc}"


def _settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in settings.items()) or "(none)"


def print_info(info: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    target = info["target"]
    console.print(f"[bold]{info['drafter']}[/bold]  ({info['directory']})")
    console.print(f"method: {info['method']} ({info['architecture']})")
    console.print(f"target: {target.get('name_or_path')} (vocabulary {target.get('vocab_size')}, hidden "
                  f"{target.get('hidden_size')}, {target.get('num_hidden_layers')} layers, fingerprint "
                  f"{target.get('specdec_fingerprint', 'none')})")
    sizes = "; ".join(f"{k} {v}" for k, v in info["sizes"].items())
    weights = info["weights"]
    if weights:
        sizes += f"; {weights['parameters'] / 1e6:.1f}M parameters stored ({weights['bytes'] / 2**20:.1f} MiB)"
    console.print(f"sizes: {sizes}")

    table = Table(title="stored proposal settings (speculators proposal_methods)")
    for col in ("proposal_type", "default", "speculative_config keys"):
        table.add_column(col)
    for e in info["proposal_methods"]:
        kind = str(e["proposal_type"]) + (f' ({e["name"]})' if "name" in e else "")
        table.add_row(kind, "yes" if e["default"] else "", _settings_text(e["settings"]))
    console.print(table)
    effective = info["effective_config"]
    text = effective if isinstance(effective, str) else json.dumps(effective)
    console.print(f'{{"method": "{info["method"]}", "model": ...}} with no other keys runs: {text}')

    tuning = info["tuning"]
    if not tuning:
        console.print("no measured figures stored (no specdec_tuning block): these settings were not tuned")
        return
    figures = Table(title="figures the settings were chosen on (specdec_tuning)")
    for col in ("stored as", "settings", "speedup", "mean acc. len", "identical", "run"):
        figures.add_column(col, justify="right" if col in ("speedup", "mean acc. len") else "left")
    runs: dict[str, dict[str, Any]] = {}
    for c in tuning.get("candidates", []):
        figures.add_row(str(c.get("proposal_type") or "-"), _settings_text(c.get("settings", {})),
                        f"{c.get('speedup')}x", str(c.get("mean_acceptance_length")), str(c.get("identical")),
                        str(c.get("run")))
        runs.setdefault(str(c.get("run")), c)
    console.print(figures)
    console.print(f"chosen: {tuning.get('chosen') or 'none (not tuned)'}")
    for name, c in runs.items():
        console.print(f"run {name} ({c.get('date')}): {c.get('prompts')}; report {c.get('report')}")
    for key in ("rule", "metric", "note", "needed"):
        if tuning.get(key):
            console.print(f"{key}: {tuning[key]}")


def cmd_drafter_info(args: argparse.Namespace) -> int:
    info = drafter_info(args.drafter)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console

    print_info(info, Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160))
    return 0


def add_drafter_info_parser(drafter_sub: argparse._SubParsersAction) -> None:
    info = drafter_sub.add_parser(
        "info", help="a drafter's method, target, sizes and stored best settings, with the figures behind them")
    info.add_argument("drafter", help="drafter directory or name (shipped, or in $SPECDEC_DRAFTERS)")
    info.add_argument("--json", action="store_true", help="print the same facts as JSON")
    info.set_defaults(func=cmd_drafter_info)
