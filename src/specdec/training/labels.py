"""Accuracy labels of scored positions, shared by the drafter objectives.

A response token is the target's greedy choice, so it is its own label (its draft-vocabulary index, -1
outside). A prompt token is the corpus's, not the target's: when prompt positions are scored, their label
is the target's most likely draft-vocabulary token there (the loss uses the target's whole distribution).
"""

from __future__ import annotations

import torch


def scored_labels(ids: torch.Tensor, label_pos: torch.Tensor, prompt_len: int, t2d_index: torch.Tensor,
                  target_p: torch.Tensor, score_prompt: bool) -> torch.Tensor:
    """Draft-vocab labels [n] of the tokens at `label_pos` [n]; `target_p` [n, Vd] is the target's
    distribution that predicts them."""
    labels = t2d_index[ids[label_pos]]
    if score_prompt:
        labels = torch.where(label_pos < prompt_len, target_p.argmax(-1), labels)
    return labels
