"""Drafters train in float32 beside a bf16 target: the LM head rows they predict through included (on CPU,
bf16 GEMMs backward ran at a fraction of a GFLOP/s), while inference keeps the target's own rows."""

from __future__ import annotations

import pytest
import torch
from specdec.training.train_dflash import DFlashObjective, DFlashTrainOptions
from specdec.training.train_eagle3 import Eagle3Objective, Eagle3TrainOptions
from specdec.training.train_medusa import MedusaObjective, MedusaTrainOptions
from specdec.training.train_mtp import MTPObjective, MTPTrainOptions

from eagle3_helpers import greedy_samples

OBJECTIVES = {
    "eagle3": (Eagle3Objective, Eagle3TrainOptions),
    "dflash": (DFlashObjective, DFlashTrainOptions),
    "medusa": (MedusaObjective, MedusaTrainOptions),
    "mtp": (MTPObjective, MTPTrainOptions),
}


def _head_rows(model: torch.nn.Module) -> torch.Tensor:
    target = getattr(model, "_target", None)  # MTP keeps (decoder, rows)
    return target[1] if target is not None else model._head


@pytest.mark.parametrize("method", sorted(OBJECTIVES))
def test_training_runs_in_float32_beside_a_bf16_target(zoo, method):
    target = zoo.load("llama", "bfloat16")
    samples = greedy_samples(target, 2, prompt_len=10, response_len=12)
    objective_cls, options_cls = OBJECTIVES[method]
    objective = objective_cls(target, samples, options_cls(draft_vocab_size=64), None, 0)
    assert _head_rows(objective.model).dtype == torch.float32
    loss, metrics = objective.loss(samples[0])
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert sum(metrics.counted) > 0
    grads = [p.grad for p in objective.model.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
