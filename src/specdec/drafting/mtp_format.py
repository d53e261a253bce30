"""MTP modules from a drafter directory (trained by `specdec train mtp`) or from the target's own checkpoint.

A checkpoint that carries MTP layers (DeepSeek-V3 layout, config key `num_nextn_predict_layers`) stores
them after the trunk as `model.layers.{num_hidden_layers + k}.*`; transformers drops those tensors when
it loads the target, so they are read here straight from the safetensors files. A trained drafter uses
the same tensor names in its model.safetensors, plus speculators' `d2t`/`t2d` for its draft vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from specdec.drafting.drafter_format import (
    SPECULATORS_VERSION,
    check_verifier,
    load_drafter,
    save_drafter,
    verifier_block,
)
from specdec.drafting.mtp_model import FULL, MTPConfig, MTPDrafter

if TYPE_CHECKING:
    from specdec.models.architecture import Architecture
    from specdec.models.loading import LoadedModel


def _layer_config(arch: Architecture) -> dict[str, Any]:
    """The block's shape: it is one layer of the target's family, so these must match the target."""
    return {"model_type": arch.model_type, "hidden_size": arch.hidden_size,
            "intermediate_size": arch.intermediate_size, "num_attention_heads": arch.num_heads,
            "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim}


def _arch(target: LoadedModel, what: str) -> Architecture:
    if target.decoder is None:
        raise ValueError(f"{what} needs the target's hidden states, which only the native runtime provides")
    return target.decoder.arch


def save_mtp(directory: Path, drafter: MTPDrafter, target: LoadedModel, num_speculative_tokens: int = 3,
             extra: dict | None = None) -> None:
    c = drafter.config
    config = {
        "architectures": ["MTPSpeculator"],
        "speculators_model_type": "mtp",
        "speculators_version": SPECULATORS_VERSION,
        "num_nextn_predict_layers": c.num_modules,
        "first_layer_index": c.first_layer_index,
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "layer_type": c.layer_type,
        "transformer_layer_config": _layer_config(drafter.arch),
        "speculators_config": {
            "algorithm": "mtp",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": verifier_block(target),
        },
        "specdec": {"shares_target_embedding": True, "shares_target_lm_head": True, **(extra or {})},
    }
    save_drafter(directory, config, drafter.to_checkpoint_tensors())


def load_mtp(directory: str | Path, target: LoadedModel) -> tuple[MTPDrafter, dict[str, Any]]:
    config, tensors = load_drafter(directory, "mtp")
    check_verifier(Path(directory), config["speculators_config"]["verifier"], target)
    arch = _arch(target, "mtp")
    if config["transformer_layer_config"] != _layer_config(arch):
        raise ValueError(f"the MTP block in {directory} ({config['transformer_layer_config']}) is not a layer of "
                         f"the target {target.name!r} ({_layer_config(arch)})")
    drafter = MTPDrafter(MTPConfig(
        num_modules=config["num_nextn_predict_layers"], hidden_size=config["hidden_size"],
        vocab_size=config["vocab_size"], draft_vocab_size=config["draft_vocab_size"],
        first_layer_index=config["first_layer_index"], layer_type=config.get("layer_type", FULL),
    ), arch)
    drafter.load_checkpoint_tensors(tensors)
    return drafter, config


def checkpoint_folder(target: LoadedModel) -> Path:
    from specdec.models.loading import resolve_model_path

    path = Path(resolve_model_path(target.name))
    if path.is_dir():
        return path
    try:  # a hub id transformers already downloaded
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(target.name, allow_patterns=["*.safetensors", "*.json"], local_files_only=True))
    except Exception as exc:
        raise ValueError(f"cannot find the safetensors files of {target.name!r} to read its MTP layers") from exc


def read_tensors(folder: Path, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.startswith(prefixes):
                    out[key] = f.get_tensor(key)
    return out


def load_checkpoint_mtp(target: LoadedModel) -> MTPDrafter:
    """The MTP modules stored in the target's own checkpoint (full vocabulary, no draft-vocab map)."""
    arch = _arch(target, "mtp")
    count = int(getattr(target.config.get_text_config(), "num_nextn_predict_layers", 0) or 0)
    if count <= 0:
        raise ValueError(f"{target.name!r} carries no MTP layers (no num_nextn_predict_layers in its config); "
                         'pass "model": a drafter trained with `specdec train mtp`')
    first = arch.num_layers
    prefixes = tuple(f"model.layers.{first + k}." for k in range(count))
    tensors = read_tensors(checkpoint_folder(target), prefixes)
    if not tensors:
        raise ValueError(f"{target.name!r} declares {count} MTP layers but its safetensors hold no "
                         f"model.layers.{first}.* tensors")
    drafter = MTPDrafter(MTPConfig(num_modules=count, hidden_size=arch.hidden_size, vocab_size=arch.vocab_size,
                                   draft_vocab_size=arch.vocab_size, first_layer_index=first), arch)
    drafter.load_checkpoint_tensors({k: v.to(target.dtype) for k, v in tensors.items()})
    return drafter
