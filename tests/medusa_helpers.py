"""Medusa heads for tiny targets: random ones (losslessness does not depend on quality)."""

from __future__ import annotations

from pathlib import Path

import torch
from specdec.drafting.medusa_format import save_medusa
from specdec.drafting.medusa_model import MedusaConfig, MedusaHeads


def draft_ids(vocab: int, size: int | None, seed: int) -> torch.Tensor:
    """A random draft vocabulary of `size` target ids (all of them when None), ascending."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(vocab, generator=gen)[: size or vocab].sort().values


def make_random_medusa(target, folder: Path, draft_vocab_size: int | None = None, seed: int = 0,
                       num_heads: int = 3, num_layers: int = 1, own_lm_heads: bool = False) -> str:
    arch = target.decoder.arch
    ids = draft_ids(target.vocab_size, draft_vocab_size, seed)
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig(arch.hidden_size, num_heads, num_layers, target.vocab_size, ids.numel(),
                                     arch.final_logit_softcap, own_lm_heads))
    with torch.no_grad():  # not the identity of a fresh head: every head drafts something else
        for p in heads.parameters():
            p.normal_(0, 0.3)
    heads.set_draft_vocab(ids)
    save_medusa(folder, heads.to(target.dtype), target)
    return str(folder)
