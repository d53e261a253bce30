"""Medusa heads <-> drafter directory (config.json in the speculators style + model.safetensors).

Tensor names follow FasterDecoding/Medusa (`medusa_head.{k}.{j}.linear.*`); a head's own vocabulary
projection, when it has one, is `medusa_head.{k}.{num_layers}.weight`, otherwise it is the target's LM head
(draft-vocab rows) and not stored; `d2t`/`t2d` as in speculators. The measured rank accuracy of every head,
when present, lets the proposer build its default tree. `load_medusa` also reads FasterDecoding's
folders (medusa_faster_decoding.py) and vLLM's Medusa checkpoints (medusa_vllm.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specdec.drafting.drafter_format import (
    SPECULATORS_VERSION,
    WEIGHTS_FILE,
    check_verifier,
    load_drafter,
    save_drafter,
    verifier_block,
)
from specdec.drafting.medusa_faster_decoding import read_faster_decoding, weights_file
from specdec.drafting.medusa_model import MedusaConfig, MedusaHeads
from specdec.drafting.medusa_vllm import is_vllm_medusa, read_vllm_medusa

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel


def save_medusa(directory: Path, heads: MedusaHeads, target: LoadedModel,
                rank_accuracy: list[list[float]] | None = None, extra: dict | None = None) -> None:
    c = heads.config
    config: dict[str, Any] = {
        "architectures": ["MedusaSpeculator"],
        "speculators_model_type": "medusa",
        "speculators_version": SPECULATORS_VERSION,
        "hidden_size": c.hidden_size,
        "medusa_num_heads": c.num_heads,
        "medusa_num_layers": c.num_layers,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "logit_softcap": c.logit_softcap,
        "speculators_config": {
            "algorithm": "medusa",
            "proposal_methods": [{"proposal_type": "tree", "speculative_tokens": c.num_heads}],
            "default_proposal_method": "tree",
            "verifier": verifier_block(target),
        },
        "specdec": {"shares_target_lm_head": not c.own_lm_heads, **({"head_rank_accuracy": rank_accuracy} if rank_accuracy else {}),
                    **(extra or {})},
    }
    save_drafter(directory, config, dict(heads.state_dict()))


def load_medusa(directory: str | Path, target: LoadedModel) -> tuple[MedusaHeads, dict[str, Any]]:
    directory = Path(directory)
    if weights_file(directory) is not None and not (directory / WEIGHTS_FILE).is_file():
        return _load_faster_decoding(directory, target)
    foreign = json.loads((directory / "config.json").read_text()) if (directory / "config.json").is_file() else {}
    if is_vllm_medusa(foreign):
        return _load_vllm(directory, foreign, target)
    config, tensors = load_drafter(directory, "medusa")
    check_verifier(directory, config["speculators_config"]["verifier"], target)
    own = f"medusa_head.0.{config['medusa_num_layers']}.weight" in tensors
    heads = MedusaHeads(MedusaConfig(
        hidden_size=config["hidden_size"], num_heads=config["medusa_num_heads"],
        num_layers=config["medusa_num_layers"], vocab_size=config["vocab_size"],
        draft_vocab_size=config["draft_vocab_size"], logit_softcap=config.get("logit_softcap"), own_lm_heads=own,
    ))
    heads.load_state_dict(tensors)
    return heads, config


def _load_faster_decoding(directory: Path, target: LoadedModel) -> tuple[MedusaHeads, dict[str, Any]]:
    fields, tensors = read_faster_decoding(directory, target.vocab_size, _hidden_size(target))
    return _heads(directory, target, fields, tensors, torch.arange(fields["vocab_size"])), \
        {"speculators_model_type": "medusa", "source_format": "faster_decoding"}


def _load_vllm(directory: Path, config: dict[str, Any], target: LoadedModel) -> tuple[MedusaHeads, dict[str, Any]]:
    fields, tensors, ids = read_vllm_medusa(directory, config, target.vocab_size, _hidden_size(target))
    return _heads(directory, target, fields, tensors, ids), \
        {"speculators_model_type": "medusa", "source_format": "vllm", "specdec": config.get("specdec", {})}


def _hidden_size(target: LoadedModel) -> int:
    return int(target.config.get_text_config().hidden_size)


def _heads(directory: Path, target: LoadedModel, fields: dict[str, Any], tensors: dict[str, torch.Tensor],
           draft_ids: torch.Tensor) -> MedusaHeads:
    """Heads with own projections from a foreign checkpoint's converted tensors (no soft-cap: neither
    FasterDecoding's nor vLLM's Medusa applies one to its heads)."""
    heads = MedusaHeads(MedusaConfig(**fields))
    missing, unexpected = heads.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if k not in ("d2t", "t2d")]
    if missing or unexpected:
        raise ValueError(f"{directory}: Medusa weights do not match {fields['num_layers']} ResBlocks per head "
                         f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
    heads.set_draft_vocab(draft_ids)
    return heads
