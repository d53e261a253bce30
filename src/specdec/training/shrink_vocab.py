"""Shrinking a learned drafter's draft vocabulary to its most frequent tokens, without retraining.

Every learned drafter here predicts through the target's own LM head rows of its draft vocabulary (the
`d2t` / `t2d` buffers), so its trained weights do not depend on which rows those are. Keeping only the
most frequent ones (the FR-Spec observation: a few thousand tokens cover most of what a model writes)
makes every draft step's LM head several times cheaper at a small loss in coverage. Medusa heads with
their own projections keep those tokens' rows of them. Verification is unchanged, so the output stays
exactly the target's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from specdec.drafting.drafter_format import CONFIG_FILE, WEIGHTS_FILE, save_drafter
from specdec.training.draft_vocab import coverage, frequent_tokens
from specdec.training.self_distill import Sample


def shrink_drafter_vocab(source: Path, output: Path, samples: Sequence[Sample], size: int) -> dict:
    """Writes to `output` the drafter of `source` with its `size` draft tokens most frequent in the
    samples' responses (then prompts). Returns the old and new sizes and their coverage of the responses."""
    source, output = Path(source), Path(output)
    if not (source / CONFIG_FILE).is_file() or not (source / WEIGHTS_FILE).is_file():
        raise ValueError(f"{source} is not a drafter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    if source.resolve() == output.resolve():
        raise ValueError("--output must differ from the drafter (its model card would no longer be true)")
    config = json.loads((source / CONFIG_FILE).read_text())
    tensors = load_file(str(source / WEIGHTS_FILE))
    if "d2t" not in tensors or "t2d" not in tensors or "draft_vocab_size" not in config:
        raise ValueError(f"the drafter in {source} has no reduced draft vocabulary (d2t/t2d) to shrink")
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    old_ids = torch.arange(d2t.numel()) + d2t.long()
    if not 1 <= size < old_ids.numel():
        raise ValueError(f"--draft-vocab-size must be in 1..{old_ids.numel() - 1} (the drafter has {old_ids.numel()})")
    responses = [s.response_ids for s in samples if s.response_ids]
    if not responses:
        raise ValueError("no generated responses to rank the draft tokens by")
    ids = frequent_tokens(responses, size, t2d.numel(), fallback=[s.prompt_ids for s in samples], within=old_ids)
    tensors["d2t"] = (ids - torch.arange(size)).to(d2t.dtype)
    new_t2d = torch.zeros_like(t2d)
    new_t2d[ids] = True if t2d.dtype == torch.bool else 1
    tensors["t2d"] = new_t2d
    kept = torch.searchsorted(old_ids, ids)  # both ascending: each kept token's row in the old vocabulary
    for key in _own_projections(config, tensors):
        tensors[key] = tensors[key][kept]
    report = {"source": source.name, "old_draft_vocab_size": int(old_ids.numel()), "draft_vocab_size": size,
              "old_coverage": round(coverage(responses, old_ids), 4), "coverage": round(coverage(responses, ids), 4)}
    config["draft_vocab_size"] = size
    config.setdefault("specdec", {})["vocab_shrunk"] = report
    save_drafter(output, config, tensors)
    return report


def _own_projections(config: dict, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of per-draft-token weight rows a drafter stores itself (Medusa heads' own projections)."""
    if config.get("speculators_model_type") != "medusa":
        return []
    names = (f"medusa_head.{k}.{config['medusa_num_layers']}.weight" for k in range(config["medusa_num_heads"]))
    return [name for name in names if name in tensors]
