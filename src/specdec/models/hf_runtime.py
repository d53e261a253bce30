"""Fallback runtime over a transformers model, for architectures without a native decoder.

Chains only (no draft trees), and not bit-exact between plain and speculative decoding in reduced
precision: transformers' attention over a growing cache changes with the number of queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec.models.runtime import ForwardResult, LogitRows, ModelRuntime, _rows


class TransformersRuntime(ModelRuntime):
    exact = False

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache

        self.model = model
        self._cache_cls = DynamicCache
        config = model.config.get_text_config()
        self.vocab_size = config.vocab_size
        self.num_layers = config.num_hidden_layers
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self._length = 0
        self._pending = 0
        self.capacity = 0

    @property
    def length(self) -> int:
        return self._length

    def reset(self, capacity: int) -> None:
        self.cache = self._cache_cls(config=self.model.config)
        self._length, self._pending, self.capacity = 0, 0, capacity

    @torch.inference_mode()
    def forward(
        self,
        tokens: Sequence[int],
        parents: Sequence[int] | None = None,
        capture: Sequence[int] = (),
        logit_rows: LogitRows = "all",
    ) -> ForwardResult:
        if self.cache is None:
            raise RuntimeError("call reset(capacity) before running the model")
        t = len(tokens)
        if parents is not None and list(parents) != list(range(-1, t - 1)):
            raise ValueError("draft trees need a native decoder; this architecture runs through transformers")
        if self._length + t > self.capacity:
            raise ValueError(f"sequence of {self._length + t} tokens exceeds capacity {self.capacity}")
        if self._pending:
            self.cache.crop(self._length)
        ids = torch.tensor([list(tokens)], device=self.device)
        positions = torch.arange(self._length, self._length + t, device=self.device)[None]
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            output_hidden_states=True,
        )
        self._pending = t
        states = out.hidden_states  # states[i] enters layer i; the last one is already normed
        hidden = {i: states[i][0] for i in capture if i < self.num_layers}
        rows = _rows(logit_rows, t)
        logits = None if rows is None else out.logits[0][rows].float()
        return ForwardResult(logits=logits, hidden=hidden, final_hidden=states[-1][0])

    def commit(self, kept: Sequence[int]) -> None:
        kept = list(kept)
        if kept != list(range(len(kept))) or len(kept) > self._pending:
            raise ValueError("the transformers fallback can only keep a prefix of the last forward")
        self._length += len(kept)
        self._pending = 0
        self.cache.crop(self._length)

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot truncate a sequence of length {self._length} to {length}")
        self._length, self._pending = length, 0
        self.cache.crop(length)
