"""Medusa heads <-> drafter directory (config.json in the speculators style + model.safetensors).

Tensor names follow FasterDecoding/Medusa (`medusa_head.{k}.{j}.linear.*`) without the per-head vocab
projection, which is the target's LM head (draft-vocab rows) and not stored; `d2t`/`t2d` as in speculators.
The measured rank accuracy of every head, when present, lets the proposer build its default tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.drafting.drafter_format import (
    SPECULATORS_VERSION,
    check_verifier,
    load_drafter,
    save_drafter,
    verifier_block,
)
from specdec.drafting.medusa_model import MedusaConfig, MedusaHeads

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
        "specdec": {"shares_target_lm_head": True, **({"head_rank_accuracy": rank_accuracy} if rank_accuracy else {}),
                    **(extra or {})},
    }
    save_drafter(directory, config, dict(heads.state_dict()))


def load_medusa(directory: str | Path, target: LoadedModel) -> tuple[MedusaHeads, dict[str, Any]]:
    config, tensors = load_drafter(directory, "medusa")
    check_verifier(Path(directory), config["speculators_config"]["verifier"], target)
    heads = MedusaHeads(MedusaConfig(
        hidden_size=config["hidden_size"], num_heads=config["medusa_num_heads"],
        num_layers=config["medusa_num_layers"], vocab_size=config["vocab_size"],
        draft_vocab_size=config["draft_vocab_size"], logit_softcap=config.get("logit_softcap"),
    ))
    heads.load_state_dict(tensors)
    return heads, config
