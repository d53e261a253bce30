"""A drafter's stored proposal settings: speculators' `proposal_methods` / `default_proposal_method` read as
speculative_config keys, and the rule by which they fill a user's config.

Each `proposal_methods` entry keeps speculators' own fields (`greedy`: a chain of `speculative_tokens`;
`dynamic_tree`: `depth`, `expansion_factor` children per node, `speculative_tokens` nodes kept) and may add
`specdec_options`: the exact speculative_config keys it stands for, including ours that speculators has no
field for (`confidence_threshold`). Without `specdec_options` the keys are derived from speculators' fields,
so a drafter written by another tool still gives its draft length.

An entry may store `"num_speculative_tokens": "auto"` with its cap `max_num_speculative_tokens` (the
draft-length policy keys, `speculative_config.py`): a config that sets no draft length then runs "auto".

`specdec_default_proposal_method_by_kernels` (ours) may name another default for a CPU kernel build, e.g.
{"amx": "dynamic_tree"}: the best shape depends on what verification rows cost there. A bare config (the
drafter alone) takes it; a config with keys of its own keeps `default_proposal_method`'s shape everywhere.
It names an entry by `specdec_name` (ours, for two entries of one proposal type, e.g. Medusa's tree with
"auto" and the same tree at a fixed depth) or else by `proposal_type`.

The rule: keys the user gave win; every other key of the chosen entry is filled in. The chosen entry is the
default one (for a bare config, this machine's kernels' one), unless the user fixed the draft's shape
(`tree_top_k`, `medusa_choices`) to another shape; then the first stored entry of the user's shape, or none.
So `{"method": "eagle3", "model": M}` runs M's stored best, `{..., "tree_top_k": 3}` M's stored best tree,
and `{..., "num_speculative_tokens": 4}` the default entry's other settings with the user's K.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from specdec.drafting.shipped import DrafterNotFound, resolve_drafter

SPECDEC_OPTIONS = "specdec_options"
# speculators_config key of ours: {kernel build: proposal type} overriding default_proposal_method there
DEFAULT_BY_KERNELS = "specdec_default_proposal_method_by_kernels"
SHAPE_KEYS = ("tree_top_k", "medusa_choices")  # keys that decide whether the draft is a chain or which tree
ENTRY_NAME = "specdec_name"  # an entry's own name (ours), where two share a proposal type


def default_rank(entry: dict[str, Any], default: str | None) -> int:
    """0 for the entry whose `specdec_name` is `default`, 1 for one of that proposal type, 2 for the rest:
    the first entry of the lowest rank is the default one."""
    if default is not None and entry.get(ENTRY_NAME) == default:
        return 0
    return 1 if entry.get("proposal_type") == default else 2


def default_entry(entries: list[dict[str, Any]], default: str | None) -> dict[str, Any] | None:
    """The entry `default` names (see default_rank), or None."""
    ranked = sorted(entries, key=lambda e: default_rank(e, default))
    return ranked[0] if ranked and default_rank(ranked[0], default) < 2 else None


def entry_options(entry: dict[str, Any]) -> dict[str, Any]:
    """The speculative_config keys one `proposal_methods` entry stands for."""
    own = entry.get(SPECDEC_OPTIONS)
    if isinstance(own, dict):
        return dict(own)
    kind = entry.get("proposal_type")
    if kind == "greedy" and isinstance(entry.get("speculative_tokens"), int):
        return {"num_speculative_tokens": entry["speculative_tokens"]}
    if kind == "dynamic_tree" and all(isinstance(entry.get(k), int)
                                      for k in ("depth", "expansion_factor", "speculative_tokens")):
        return {"num_speculative_tokens": entry["depth"], "tree_top_k": entry["expansion_factor"],
                "tree_num_draft_tokens": entry["speculative_tokens"]}
    return {}  # a proposal type without a counterpart here (e.g. speculators' static branching trees)


def draft_shape(method: str, options: dict[str, Any]) -> str:
    """chain, tree, or for Medusa static / grown / fixed tree, from complete option values."""
    if options.get("medusa_choices") is not None:
        return "fixed tree"
    top_k = options.get("tree_top_k")
    if method == "medusa":
        return "static tree" if top_k is None else "grown tree"
    return "tree" if isinstance(top_k, int) and top_k > 1 else "chain"


def read_drafter_config(model: Any, method: str) -> tuple[Path, dict[str, Any]] | None:
    """(config path, config) of the drafter `model` names when it is a speculators drafter of `method`;
    None otherwise (not a drafter name, another kind of model): loading the drafter reports those."""
    if not isinstance(model, str):
        return None
    try:
        path = resolve_drafter(model) / "config.json"
    except DrafterNotFound:
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("speculators_model_type") != method:
        return None
    return path, config


def stored_entries(config: dict[str, Any], bare: bool = False, quantization: str | None = None,
                   device: str | torch.device | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The stored entries and the default one's name: for a `bare` config (the drafter alone, no other key)
    the one for the kernels a target of `quantization` on `device` runs on here (default_for_kernels), else
    `default_proposal_method`."""
    spec = config.get("speculators_config") or {}
    entries = [e for e in spec.get("proposal_methods") or [] if isinstance(e, dict)]
    default = default_for_kernels(spec, quantization, device) if bare else spec.get("default_proposal_method")
    return entries, default


def runs_on_cpu(device: str | torch.device | None) -> bool:
    """Whether a target loaded for `device` runs on the CPU (None: cuda where available, as load_model)."""
    if device is None:
        return not torch.cuda.is_available()
    return torch.device(device).type == "cpu"


def default_for_kernels(spec: dict[str, Any], quantization: str | None = None,
                        device: str | torch.device | None = None) -> str | None:
    """`default_proposal_method`, or the entry `DEFAULT_BY_KERNELS` names for the CPU kernels a bf16 target
    on the CPU runs on here (models/fast_linear.kernel_isa()); a target on a GPU takes
    `default_proposal_method` (the CPU's kernels say nothing of its rows' cost). The best shape depends on
    what verification rows cost: where the bf16 linears run on AMX tiles 16 rows cost about one and EAGLE-3's
    tree beats its chain, elsewhere the chain wins. A quantized target (`quantization` set) takes
    `default_proposal_method`: its kernels' rows cost more (16 rows about twice one), and there the fixed
    trees of the AMX defaults lost to the portable ones (docs/long-context-runs.md); except `w8a8_int8` on
    the AMX-INT8 build (cheap_rows), where the AMX entries drafted more at the same speed
    (docs/quantization-runs.md). Only a bare config takes it (no key but `model` and `quantization`): a config
    that sets a key of its own (a length, a threshold) keeps meaning the same shape on every machine."""
    default = spec.get("default_proposal_method")
    by_kernels = spec.get(DEFAULT_BY_KERNELS)
    if (not isinstance(by_kernels, dict) or not by_kernels or not cheap_rows(quantization)
            or not runs_on_cpu(device)):
        return default
    from specdec.models import fast_linear

    return by_kernels.get(fast_linear.kernel_isa() or "", default)


def cheap_rows(quantization: str | None) -> bool:
    """Whether a target of `quantization` prices verification rows as the dense bf16 target does here: dense,
    or `w8a8_int8` on the AMX-INT8 build (one int32 sum per output: 16 rows cost about one, as bf16's on AMX)."""
    if quantization in (None, "none"):
        return True
    if quantization != "w8a8_int8":
        return False
    from specdec.quantization.kernel import quant_kernel_isa

    return quant_kernel_isa() == "amx_int8"


def choose_entry(method: str, options_class: type, user: dict[str, Any],
                 entries: list[dict[str, Any]], default: str | None) -> dict[str, Any] | None:
    """The stored entry whose settings fill the user's config (see the module's rule), or None."""
    ordered = sorted(entries, key=lambda e: default_rank(e, default))  # the default one first
    if not any(k in user for k in SHAPE_KEYS):
        return ordered[0] if ordered else None
    defaults = {f.name: f.default for f in dataclasses.fields(options_class)
                if f.default is not dataclasses.MISSING}
    wanted = draft_shape(method, {**defaults, **user})
    for entry in ordered:
        if draft_shape(method, {**defaults, **entry_options(entry)}) == wanted:
            return entry
    return None


SCHEDULE_KEYS = ("num_speculative_tokens", "max_num_speculative_tokens", "num_speculative_tokens_by_batch_size")


# keys that leave a config bare: they choose the drafter and how its weights run, not the draft's shape
NOT_SHAPE_KEYS = frozenset({"model", "quantization"})


def stored_entry(method: str, options_class: type, user: dict[str, Any], quantization: str | None = None,
                 device: str | torch.device | None = None) -> tuple[dict[str, Any] | None, Path | None]:
    """The stored entry that fills `user` (see the module's rule) and the config path of the drafter `user`
    names; (None, path) when no entry fits, (None, None) when `user` names no speculators drafter of `method`."""
    found = read_drafter_config(user.get("model"), method)
    if found is None:
        return None, None
    path, config = found
    bare = not set(user) - NOT_SHAPE_KEYS
    return choose_entry(method, options_class, user, *stored_entries(config, bare, quantization, device)), path


def stored_schedule(entry: dict[str, Any] | None, user: dict[str, Any]) -> dict[str, Any]:
    """`"num_speculative_tokens": "auto"` and its stored cap, when `entry` stores "auto" and the user set no
    fixed draft length or schedule; else {}."""
    if isinstance(user.get("num_speculative_tokens"), int) or "num_speculative_tokens_by_batch_size" in user:
        return {}
    stored = entry_options(entry) if entry else {}
    if stored.get("num_speculative_tokens") != "auto":
        return {}
    cap = stored.get("max_num_speculative_tokens")
    return {"num_speculative_tokens": "auto", **({"max_num_speculative_tokens": cap} if cap is not None else {})}


def drafter_defaults(method: str, options_class: type, user: dict[str, Any], entry: dict[str, Any] | None,
                     path: Path | None) -> dict[str, Any]:
    """The keys `entry` (from `stored_entry`, read from `path`) adds to the user's config (`user`: its method
    keys, schedule keys already taken off). Raises ValueError when the stored keys are not options of
    `method`."""
    if entry is None:
        return {}
    stored = entry_options(entry)
    if stored.get("num_speculative_tokens") == "auto":  # the schedule, taken by stored_schedule
        stored = {k: v for k, v in stored.items() if k not in SCHEDULE_KEYS}
    fields = {f.name for f in dataclasses.fields(options_class)}
    unknown = sorted(set(stored) - fields)
    if unknown:
        raise ValueError(f"{path}: stored proposal settings {entry.get('proposal_type')!r} have keys that "
                         f"{method!r} does not take: {', '.join(unknown)}")
    return {k: v for k, v in stored.items() if k not in user and k != "model"}
