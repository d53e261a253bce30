"""Temperature, top-k and top-p, applied identically to target and draft logits."""

from __future__ import annotations

import torch

from specdec.sampling_params import MIN_TEMPERATURE


def sampling_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """[N, V] logits -> [N, V] float32 probabilities after temperature, then top-k, then top-p (vLLM's order).

    Top-k keeps every token tied with the k-th largest logit; top-p keeps the smallest set of most likely
    tokens whose mass reaches top_p (always at least one).
    """
    if not MIN_TEMPERATURE <= temperature < float("inf"):  # smaller ones overflow the division: NaN probabilities
        raise ValueError(
            f"sampling_probs needs a finite temperature >= {MIN_TEMPERATURE}; temperature 0 is greedy (argmax)"
        )
    logits = logits.float() / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # the first token is never dropped: its mass_before is 0
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a [V] distribution. Drawn on the CPU, where the request's generator lives, so a seed
    gives the same stream on every device."""
    if probs.device.type != "cpu":
        probs = probs.cpu()
    return int(torch.multinomial(probs, 1, generator=generator))
