"""Target features for drafter training: hidden states of chosen layers and the final normed hidden state.

One target forward per sample over prompt + response, without the LM head (the labels are the response
tokens themselves: greedy self-distillation makes each one the target's argmax). Results are cached as
safetensors files within a disk budget; past the budget they are recomputed on every use.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.models.loading import LoadedModel


@dataclass
class SampleFeatures:
    hidden: dict[int, torch.Tensor]  # layer index -> [T, H] (residual stream entering the layer; L = last output)
    final_hidden: torch.Tensor  # [T, H] after the final norm


_VOLATILE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")


def target_identity(target: LoadedModel, samples_per_tensor: int = 16) -> str:
    """What the features depend on, hashed: the config, the dtype and a few strided values of every
    weight tensor (a fine-tune changes them all; a few reads, not the gigabytes). By content, not by
    name, so the same weights loaded from another path share the cache."""
    assert target.decoder is not None
    h = hashlib.sha256()
    config = {k: v for k, v in target.config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    h.update(str(target.dtype).encode())
    for name, tensor in target.decoder.state_dict().items():
        flat = tensor.detach().reshape(-1)
        picked = flat[:: max(1, flat.numel() // samples_per_tensor)][:samples_per_tensor]
        h.update(name.encode())
        h.update(picked.float().cpu().numpy().tobytes())
    return h.hexdigest()[:20]


class FeatureExtractor:
    def __init__(self, target: LoadedModel, layers: Sequence[int], cache_dir: Path | None = None,
                 budget_bytes: int = 4 << 30) -> None:
        if target.decoder is None:
            raise ValueError("drafter training needs the native runtime (hidden states of chosen layers)")
        self.target = target
        self.layers = tuple(sorted(set(layers)))
        self.runtime = target.new_runtime()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.budget = budget_bytes
        self.identity = ""
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self.identity = target_identity(target)  # a cache shared by targets never mixes their features

    def _used(self) -> int:
        assert self.cache_dir is not None
        return sum(p.stat().st_size for p in self.cache_dir.glob("*.safetensors"))

    def _key(self, ids: Sequence[int]) -> str:
        return hashlib.sha1(repr((self.identity, self.layers, list(ids))).encode()).hexdigest()[:20]

    @torch.inference_mode()
    def compute(self, ids: Sequence[int]) -> SampleFeatures:
        capacity = -(-len(ids) // 128) * 128
        self.runtime.reset(capacity)
        out = self.runtime.forward(list(ids), capture=self.layers, logit_rows=None)
        assert out.final_hidden is not None
        return SampleFeatures({i: out.hidden[i] for i in self.layers}, out.final_hidden)

    def get(self, ids: Sequence[int]) -> SampleFeatures:
        if self.cache_dir is None:
            return self.compute(ids)
        path = self.cache_dir / f"{self._key(ids)}.safetensors"
        if path.is_file():
            data = load_file(str(path))
            return SampleFeatures({i: data[f"h{i}"] for i in self.layers}, data["final"])
        feats = self.compute(ids)
        if self._used() < self.budget:
            tensors = {f"h{i}": feats.hidden[i].cpu() for i in self.layers}
            tensors["final"] = feats.final_hidden.cpu()
            tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two trainings may share a cache
            save_file(tensors, str(tmp))
            tmp.rename(path)
        return feats
