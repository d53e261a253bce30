"""Medusa heads published in FasterDecoding's layout (the Medusa paper's code, and most Medusa heads on the
Hugging Face hub): a folder with `config.json` (`medusa_num_heads`, `medusa_num_layers`,
`base_model_name_or_path`) and `medusa_lm_head.safetensors` or `medusa_lm_head.pt`, whose keys are
`{head}.{layer}.linear.weight|bias` (ResBlocks) and `{head}.{num_layers}.weight` (the head's own
projection over the target's whole vocabulary).

Read here into our layout: the same tensors under `medusa_head.`, own projections, the full vocabulary as
the draft vocabulary. Such a checkpoint names its target only by path, so the check is on shapes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
_KEY = re.compile(r"^(?:medusa_head\.)?(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def weights_file(directory: Path) -> Path | None:
    """The FasterDecoding weights file in `directory`, if it holds one."""
    return next((directory / name for name in WEIGHT_FILES if (directory / name).is_file()), None)


def read_faster_decoding(directory: Path, target_vocab_size: int, target_hidden_size: int
                         ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(MedusaConfig fields, state dict for MedusaHeads) of a FasterDecoding checkpoint; ValueError with
    the reason when it is malformed or made for a target of another shape."""
    path = weights_file(directory)
    if path is None:
        raise ValueError(f"{directory} holds no {' or '.join(WEIGHT_FILES)}")
    raw = load_file(str(path)) if path.suffix == ".safetensors" else torch.load(path, map_location="cpu",
                                                                                  weights_only=True)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    tensors: dict[str, torch.Tensor] = {}
    heads: set[int] = set()
    for key, value in raw.items():
        match = _KEY.match(key)
        if match is None:
            raise ValueError(f"{path}: unexpected tensor {key!r} for a FasterDecoding Medusa checkpoint")
        head, layer, name = int(match[1]), int(match[2]), match[3]
        heads.add(head)
        tensors[f"medusa_head.{head}.{layer}.{name}"] = value
    num_heads = int(config.get("medusa_num_heads", len(heads)))
    num_layers = int(config.get("medusa_num_layers", 1))
    if heads != set(range(num_heads)):
        raise ValueError(f"{path}: config.json says {num_heads} heads, the weights hold heads {sorted(heads)}")
    projections = [tensors.get(f"medusa_head.{k}.{num_layers}.weight") for k in range(num_heads)]
    if any(p is None for p in projections):
        raise ValueError(f"{path}: every head needs its projection `{{head}}.{num_layers}.weight`")
    vocab, hidden = projections[0].shape
    if hidden != target_hidden_size or vocab != target_vocab_size:
        raise ValueError(f"the Medusa heads in {directory} (made for {config.get('base_model_name_or_path')!r}) "
                         f"project hidden size {hidden} onto {vocab} tokens; the target has hidden size "
                         f"{target_hidden_size} and {target_vocab_size} tokens")
    fields = {"hidden_size": hidden, "num_heads": num_heads, "num_layers": num_layers, "vocab_size": vocab,
              "draft_vocab_size": vocab, "own_lm_heads": True}
    return fields, tensors
