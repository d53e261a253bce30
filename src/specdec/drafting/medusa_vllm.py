"""Medusa heads in vLLM's own checkpoint layout (`vllm/model_executor/models/medusa.py`): `config.json` with
`model_type: "medusa"`, `num_heads`, `num_hidden_layers`, `vocab_size`, `truncated_vocab_size`, and
`model.safetensors` with `blocks.{head}.layers.{layer}.weight[|bias]` (bias only with `medusa_fc_bias`),
`lm_heads.{head}.weight` (one shared `lm_heads.0.weight` or `lm_head.weight` with `original_lm_head`), and
with a truncated vocabulary `token_map` (the target id of each draft row, any order). Names may carry the
`medusa_heads.` prefix.

Read here into our layout: ResBlocks (a missing bias is zero), own projections (a shared one copied to
every head), the token map as the draft vocabulary (sorted, its rows with it). `write_vllm_medusa` writes
our heads in this layout, so they serve on vLLM (`--speculative-config '{"method": "medusa", "model": DIR}'`).

vLLM 0.32 cannot load a checkpoint with a `token_map`: `Medusa.load_weights` turns it into an
`nn.Parameter` but leaves it out of the names it reports as loaded, so the loader's strict check
(`DefaultModelLoader.track_weights_loading`) fails with "Following weights were not initialized from
checkpoint: {'token_map'}". So heads that share the target's LM head are written with the *whole* head
(`original_lm_head`, `truncated_vocab_size == vocab_size`, no token map): they then draft over the full
vocabulary, as our heads do with `context_vocab` for any token. Heads with their own projections over a
reduced vocabulary have no rows for the other tokens, so they are only written with the token map
(`token_map=True`), which vLLM loads with `model_loader_extra_config={"enable_weights_track": False}`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from specdec.drafting.medusa_model import MedusaHeads

_BLOCK = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")


def is_vllm_medusa(config: dict[str, Any]) -> bool:
    return config.get("model_type") == "medusa" and "speculators_model_type" not in config


def read_vllm_medusa(directory: Path, config: dict[str, Any], target_vocab_size: int, target_hidden_size: int
                     ) -> tuple[dict[str, Any], dict[str, torch.Tensor], torch.Tensor]:
    """(MedusaConfig fields, state dict for MedusaHeads, ascending draft vocabulary ids) of a vLLM Medusa
    checkpoint; ValueError with the reason when it is malformed or made for a target of another shape."""
    raw = {k.removeprefix("medusa_heads."): v for k, v in load_file(str(directory / "model.safetensors")).items()}
    num_heads, num_layers = int(config["num_heads"]), int(config["num_hidden_layers"])
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    if hidden != target_hidden_size or vocab != target_vocab_size:
        raise ValueError(f"the Medusa heads in {directory} are for hidden size {hidden} and {vocab} tokens; the "
                         f"target has hidden size {target_hidden_size} and {target_vocab_size} tokens")
    if float(config.get("logit_scale", 1.0)) != 1.0:
        raise ValueError(f"{directory}: logit_scale {config['logit_scale']} is not supported (only 1.0)")
    tensors: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        match = _BLOCK.match(key)
        if match:
            tensors[f"medusa_head.{match[1]}.{match[2]}.linear.{match[3]}"] = value
    for k in range(num_heads):
        for j in range(num_layers):
            if f"medusa_head.{k}.{j}.linear.weight" not in tensors:
                raise ValueError(f"{directory}: no weight for blocks.{k}.layers.{j}")
            tensors.setdefault(f"medusa_head.{k}.{j}.linear.bias", torch.zeros(hidden))
    shared = raw.get("lm_head.weight", raw.get("lm_heads.0.weight"))
    heads = [raw.get(f"lm_heads.{k}.weight", shared if config.get("original_lm_head") else None)
             for k in range(num_heads)]
    if any(h is None for h in heads):
        raise ValueError(f"{directory}: every head needs lm_heads.{{head}}.weight (or original_lm_head)")
    truncated = int(config.get("truncated_vocab_size") or vocab)
    if truncated < vocab:
        if "token_map" not in raw:
            raise ValueError(f"{directory}: truncated_vocab_size {truncated} < vocab_size {vocab} needs a token_map")
        token_map = raw["token_map"].long()
        heads = [h[token_map] if h.shape[0] > token_map.numel() else h for h in heads]
        order = token_map.argsort()
        ids, heads = token_map[order], [h[order] for h in heads]
    else:
        ids = torch.arange(vocab)
    if any(h.shape != (ids.numel(), hidden) for h in heads):
        raise ValueError(f"{directory}: lm_heads must be [{ids.numel()}, {hidden}], got {list(heads[0].shape)}")
    for k, h in enumerate(heads):
        tensors[f"medusa_head.{k}.{num_layers}.weight"] = h
    fields = {"hidden_size": hidden, "num_heads": num_heads, "num_layers": num_layers, "vocab_size": vocab,
              "draft_vocab_size": ids.numel(), "own_lm_heads": True}
    return fields, tensors, ids


TOKEN_MAP_FAILURE = ("vLLM 0.32 fails to load a Medusa checkpoint with a token_map (\"Following weights were not "
                     "initialized from checkpoint: {'token_map'}\"): Medusa.load_weights registers it as a parameter "
                     "but does not report it as loaded")


def write_vllm_medusa(directory: Path, heads: MedusaHeads, target_head: torch.Tensor | None = None,
                      token_map: bool = False, dtype: torch.dtype = torch.bfloat16,
                      rank_accuracy: list[list[float]] | None = None) -> dict[str, Any]:
    """Writes `heads` (attached to their target) as a vLLM Medusa checkpoint; returns its config.

    `target_head` [vocab, H]: the target's whole LM head, stored for heads that share it (see the module
    note). `token_map=True` keeps a reduced draft vocabulary as vLLM's token map instead (vLLM 0.32 then
    needs `model_loader_extra_config={"enable_weights_track": False}`). The heads' measured rank accuracy
    (our default tree's source) rides along under `specdec`, which vLLM ignores."""
    # vLLM's Medusa applies no final soft-cap; a target's is monotonic, so the heads' ranking (vLLM drafts
    # each head's top-1) is the same
    c = heads.config
    reduced = c.draft_vocab_size < c.vocab_size
    whole_head = reduced and not token_map  # the reduced vocabulary widened to the target's whole head
    if whole_head and c.own_lm_heads:
        raise ValueError(f"these heads have their own {c.draft_vocab_size}-row projections, not the target's "
                         f"{c.vocab_size}-token head, so they can only be written with a token map, and "
                         f"{TOKEN_MAP_FAILURE}; pass token_map=True and load them in vLLM with "
                         "model_loader_extra_config={'enable_weights_track': False}")
    if whole_head and target_head is None:
        raise ValueError("heads that share the target's LM head need target_head (the whole head) to be written "
                         "without a token map")
    tensors: dict[str, torch.Tensor] = {}
    for k in range(c.num_heads):
        for j in range(c.num_layers):
            block = heads.medusa_head[k][j].linear
            tensors[f"blocks.{k}.layers.{j}.weight"] = block.weight
            tensors[f"blocks.{k}.layers.{j}.bias"] = block.bias
    for k in range(c.num_heads if c.own_lm_heads else 1):
        tensors[f"lm_heads.{k}.weight"] = target_head if whole_head else heads.head_rows_of(k)
    if reduced and token_map:
        tensors["token_map"] = heads.draft_ids()
    rows = c.draft_vocab_size if reduced and token_map else c.vocab_size
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": c.hidden_size,
              "vocab_size": c.vocab_size, "num_heads": c.num_heads, "num_hidden_layers": c.num_layers,
              "truncated_vocab_size": rows, "medusa_fc_bias": True,
              "original_lm_head": not c.own_lm_heads, "max_paths": 64, "topk": 10,
              **({"specdec": {"head_rank_accuracy": rank_accuracy}} if rank_accuracy else {})}
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: (v if k == "token_map" else v.to(dtype)).detach().contiguous().cpu() for k, v in tensors.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config
