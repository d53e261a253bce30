"""MTP drafters for tiny targets (random ones: losslessness does not depend on quality), and a tiny
checkpoint that carries MTP layers after its trunk, in the DeepSeek-V3 layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from specdec.drafting.mtp_format import save_mtp
from specdec.drafting.mtp_model import MTPConfig, MTPDrafter
from specdec.models.architecture import architecture_from_config

from medusa_helpers import draft_ids as random_draft_ids
from tiny_models import make_tiny_model


def random_mtp(arch, vocab_size: int, num_modules: int = 1, draft_ids: torch.Tensor | None = None,
               seed: int = 0) -> MTPDrafter:
    torch.manual_seed(seed)
    size = vocab_size if draft_ids is None else draft_ids.numel()
    drafter = MTPDrafter(MTPConfig(num_modules, arch.hidden_size, vocab_size, size, arch.num_layers), arch)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
            else:
                p.add_(torch.randn_like(p) * 0.1)  # norms near their identity
    if draft_ids is not None:
        drafter.set_draft_vocab(draft_ids)
    return drafter


def make_random_mtp(target, folder: Path, draft_vocab_size: int | None = None, seed: int = 0,
                    num_modules: int = 1) -> str:
    ids = random_draft_ids(target.vocab_size, draft_vocab_size, seed)
    drafter = random_mtp(target.decoder.arch, target.vocab_size, num_modules, ids, seed)
    save_mtp(folder, drafter.to(target.dtype), target)
    return str(folder)


def make_mtp_checkpoint(folder: Path, spec: dict, num_mtp: int = 1, seed: int = 7,
                        tensors: dict[str, torch.Tensor] | None = None) -> str:
    """A tiny target (make_tiny_model(**spec)) whose model.safetensors also holds `num_mtp` MTP layers as
    DeepSeek-V3 stores them: model.layers.{L + k}.{enorm, hnorm, eh_proj, shared_head.*, embed_tokens,
    the decoder block}, with num_nextn_predict_layers in config.json. `tensors` (MTPDrafter names from
    to_checkpoint_tensors) replaces the random layers."""
    path = Path(make_tiny_model(folder, **spec))
    config = json.loads((path / "config.json").read_text())
    config["num_nextn_predict_layers"] = num_mtp
    (path / "config.json").write_text(json.dumps(config, indent=2))
    weights = load_file(str(path / "model.safetensors"))
    if tensors is None:
        from transformers import AutoConfig

        arch = architecture_from_config(AutoConfig.from_pretrained(path))
        tensors = random_mtp(arch, arch.vocab_size, num_mtp, seed=seed).to_checkpoint_tensors()
    tensors = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    L = config["num_hidden_layers"]
    for k in range(num_mtp):  # DeepSeek's per-layer copies of the shared embedding and head
        weights[f"model.layers.{L + k}.embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
        head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
        weights[f"model.layers.{L + k}.shared_head.head.weight"] = head.clone()
    weights.update({k: v.to(torch.float32).contiguous() for k, v in tensors.items()})
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)

