"""Accuracy labels of scored positions, shared by the drafter objectives.

A response token is the target's greedy choice, so it is its own label (its draft-vocabulary index, -1
outside). A prompt token is the corpus's, not the target's: when prompt positions are scored, their label
is the target's most likely draft-vocabulary token there (the loss uses the target's whole distribution).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specdec.training.context_columns import ContextColumns


def scored_labels(ids: torch.Tensor, label_pos: torch.Tensor, prompt_len: int, t2d_index: torch.Tensor,
                  target_p: torch.Tensor, score_prompt: bool) -> torch.Tensor:
    """Draft-vocab labels [n] of the tokens at `label_pos` [n]; `target_p` [n, Vd] is the target's
    distribution that predicts them."""
    labels = t2d_index[ids[label_pos]]
    if score_prompt:
        labels = torch.where(label_pos < prompt_len, target_p.argmax(-1), labels)
    return labels


def targets_and_labels(target_logits: torch.Tensor, final_hidden: torch.Tensor, ids: torch.Tensor,
                       label_pos: torch.Tensor, context_end: torch.Tensor, prompt_len: int, t2d_index: torch.Tensor,
                       extra: ContextColumns | None, softcap: float | None,
                       score_prompt: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the target's distribution [n, V'], labels [n]) for the tokens at `label_pos` [n]. `target_logits`
    [n, Vd] are the target's draft-vocabulary logits at the positions predicting them; with context columns
    (`extra`), their final-normed states `final_hidden` [n, H] score the sample's tokens seen by
    `context_end` [n] too (training/context_columns.py)."""
    with torch.no_grad():
        if extra is not None:
            target_logits = extra.extend(target_logits, final_hidden, context_end, softcap)
        p = torch.softmax(target_logits, dim=-1)
    labels = scored_labels(ids, label_pos, prompt_len, t2d_index, p, score_prompt)
    if extra is not None:
        labels = extra.labels(ids[label_pos], labels, context_end)
    return p, labels
