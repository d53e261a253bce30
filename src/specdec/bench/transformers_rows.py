"""Reference rows from transformers' own `generate` on the same prompts (`--include-transformers`).

Two modes on a transformers model (`load_model(..., native=False)`): plain greedy (`do_sample=False`)
and its prompt lookup decoding (`prompt_lookup_num_tokens=K`, `max_matching_ngram_size=n`), with K the
speculative config's num_speculative_tokens (10, transformers' default, when the method has none) and n
its prompt_lookup_max when the method has one (else transformers' default). Both stop on the same EOS
ids as our engine and run greedy even when the bench samples (temperature > 0).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

GREEDY = "greedy"
PROMPT_LOOKUP = "prompt_lookup"
MODES = (GREEDY, PROMPT_LOOKUP)
DEFAULT_LOOKUP_TOKENS = 10


class Peer(Protocol):
    """A reference decoder whose rows summarize_rows builds (this module's, or llama_cpp_rows.py's)."""

    def describe(self, mode: str) -> dict[str, Any]: ...


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class TransformersBaseline:
    model: Any  # a transformers causal LM
    eos_token_ids: Sequence[int]
    pad_token_id: int | None
    max_new_tokens: int
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS
    max_matching_ngram_size: int | None = None
    configs: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        from transformers import GenerationConfig

        common = dict(
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            eos_token_id=list(self.eos_token_ids),
            pad_token_id=self.pad_token_id if self.pad_token_id is not None else self.eos_token_ids[0],
        )
        lookup = {"prompt_lookup_num_tokens": self.lookup_tokens}
        if self.max_matching_ngram_size is not None:
            lookup["max_matching_ngram_size"] = self.max_matching_ngram_size
        self.configs = {GREEDY: GenerationConfig(**common), PROMPT_LOOKUP: GenerationConfig(**common, **lookup)}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def describe(self, mode: str) -> dict[str, Any]:
        if mode == GREEDY:
            return {"label": "transformers generate (greedy)"}
        return {
            "label": f"transformers prompt lookup (K={self.lookup_tokens})",
            "prompt_lookup_num_tokens": self.lookup_tokens,
            "max_matching_ngram_size": self.configs[PROMPT_LOOKUP].max_matching_ngram_size,
        }

    @torch.inference_mode()
    def generate(self, prompt: Sequence[int], mode: str) -> tuple[list[int], float]:
        """Generated ids (without the prompt) and wall seconds."""
        device = self.device
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
        synchronize(device)
        start = time.perf_counter()
        out = self.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=self.configs[mode]
        )
        synchronize(device)
        seconds = time.perf_counter() - start
        return out[0, ids.shape[1] :].tolist(), seconds


def lookup_settings(speculative_config: Any) -> tuple[int, int | None]:
    """(prompt_lookup_num_tokens, max_matching_ngram_size) matching our speculative config."""
    k = speculative_config.num_speculative_tokens if speculative_config is not None else 0
    ngram = getattr(getattr(speculative_config, "options", None), "prompt_lookup_max", None)
    return (k or DEFAULT_LOOKUP_TOKENS), ngram


def summarize_rows(
    runs: Sequence[dict[str, tuple[list[int], float]]],
    plain_ids: Sequence[Sequence[int]],
    plain_seconds: float,
    plain_tokens: int,
    baseline: Peer,
    peer: str = "transformers",
) -> dict[str, dict[str, Any]]:
    """One row per mode: tokens/s, speedup against OUR plain decoding (plain seconds / their seconds over
    the same prompts; throughput_ratio is their tokens/s over our plain tokens/s, the fairer number when
    they generate different tokens), and how many outputs equal our plain output and the peer's own greedy
    (`identical_to_{peer}_greedy`)."""
    rows = {}
    plain_tps = plain_tokens / plain_seconds if plain_seconds else 0.0
    for mode in MODES:
        ids = [run[mode][0] for run in runs]
        seconds = sum(run[mode][1] for run in runs)
        tokens = sum(len(x) for x in ids)
        tps = tokens / seconds if seconds else 0.0
        same_plain = sum(list(a) == list(b) for a, b in zip(ids, plain_ids))
        same_greedy = sum(a == run[GREEDY][0] for a, run in zip(ids, runs))
        n = len(runs)
        rows[mode] = {
            **baseline.describe(mode),
            "prompts": n,
            "new_tokens": tokens,
            "seconds": round(seconds, 4),
            "tokens_per_second": round(tps, 2),
            "speedup_vs_plain": round(plain_seconds / seconds, 4) if seconds else 0.0,
            "throughput_ratio_vs_plain": round(tps / plain_tps, 4) if plain_tps else 0.0,
            "identical_to_plain": same_plain,
            "identical_to_plain_fraction": round(same_plain / n, 4) if n else 0.0,
            f"identical_to_{peer}_greedy": same_greedy,
            f"identical_to_{peer}_greedy_fraction": round(same_greedy / n, 4) if n else 0.0,
        }
    return rows
