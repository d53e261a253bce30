"""`specdec train medusa`: Medusa heads for a target, from self-distilled samples."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdec.drafting.medusa_format import load_medusa, save_medusa
from specdec.drafting.medusa_model import MedusaConfig, MedusaHeads, expected_accepted, tree_from_accuracy
from specdec.models.loading import LoadedModel
from specdec.training.context_columns import context_response_coverage
from specdec.training.draft_vocab import coverage, frequent_tokens
from specdec.training.eagle3_objective import default_aux_layers
from specdec.training.features import FeatureExtractor
from specdec.training.medusa_objective import MedusaMetrics, medusa_loss
from specdec.training.self_distill import Sample
from specdec.training.train_eagle3 import _prompt_tokens
from specdec.training.trainer import TrainSettings, train
from specdec.training.warm_start import check_shape, copy_trained_weights, start_vocabulary


@dataclass
class MedusaTrainOptions:
    draft_vocab_size: int | None = None  # None: 32768, or with init_from the start's own vocabulary
    num_heads: int | None = None  # default 4, or with init_from the start's
    num_layers: int | None = None  # ResBlocks per head: default 1, or with init_from the start's
    loss_decay: float = 0.8  # head k weighted decay**k
    # layers cached with the final hidden state (which is all Medusa reads): EAGLE-3's by default, so one
    # feature cache serves both trainings
    feature_layers: list[int] | None = None
    tree_nodes: int = 24  # nodes of the tree whose estimated acceptance the report gives
    score_prompt: bool = False  # also train on prompt positions (labels: the target's distribution there)
    init_from: Path | None = None  # start from these Medusa heads (their shape, weights and vocabulary)
    context_vocab: bool = True  # also score the sample's tokens outside the draft vocabulary once seen
    # every head its own vocabulary projection (Medusa-1), started from the target's LM head rows; None: no,
    # or with init_from the start's (a start that shares the target's rows can grow own projections)
    own_lm_heads: bool | None = None


class MedusaObjective:
    def __init__(self, target: LoadedModel, samples: list[Sample], options: MedusaTrainOptions,
                 feature_cache: Path | None, cache_budget_bytes: int) -> None:
        decoder = target.decoder
        if decoder is None:
            raise ValueError("medusa training needs the native runtime (the target's final hidden states)")
        torch.manual_seed(0)
        if options.init_from is not None:
            start, _ = load_medusa(options.init_from, target)
            # deeper heads may grow from trained ones: the new ResBlocks start at zero, i.e. as the identity,
            # so training starts from exactly the saved heads' predictions
            layers = max(options.num_layers or 0, start.config.num_layers)
            check_shape({"num_heads": options.num_heads}, {"num_heads": start.config.num_heads}, options.init_from)
            if options.num_layers is not None and options.num_layers < start.config.num_layers:
                raise ValueError(f"--init-from {options.init_from} has {start.config.num_layers} ResBlocks per head; "
                                 f"--num-layers {options.num_layers} would drop trained layers (it can only grow)")
            own = start.config.own_lm_heads if options.own_lm_heads is None else options.own_lm_heads
            if start.config.own_lm_heads and not own:
                raise ValueError(f"--init-from {options.init_from} has its own vocabulary projections; "
                                 "training cannot drop them")
            if start.config.own_lm_heads and layers > start.config.num_layers:
                raise ValueError(f"--init-from {options.init_from} has its own vocabulary projections; "
                                 "its heads cannot grow ResBlocks")
            grow_own = own and not start.config.own_lm_heads
            ids = start_vocabulary(start.draft_ids(), options.draft_vocab_size, (s.response_ids for s in samples),
                                   target.vocab_size, lambda: _prompt_tokens(target, samples), options.init_from)
            if start.config.own_lm_heads and ids.numel() != start.config.draft_vocab_size:
                raise ValueError(f"--init-from {options.init_from} has its own vocabulary projections; shrink its "
                                 "vocabulary with `specdec drafter shrink-vocab` first")
            self.model = MedusaHeads(replace(start.config, draft_vocab_size=ids.numel(), num_layers=layers,
                                             own_lm_heads=own))
            added = {f"medusa_head.{k}.{j}.linear.{w}" for k in range(start.config.num_heads)
                     for j in range(start.config.num_layers, layers) for w in ("weight", "bias")}
            added |= {f"medusa_head.{k}.{layers}.weight" for k in range(start.config.num_heads) if grow_own}
            copy_trained_weights(self.model, start, options.init_from, added)
        else:
            vocab = min(options.draft_vocab_size or 32768, target.vocab_size)
            ids = frequent_tokens((s.response_ids for s in samples), vocab, target.vocab_size,
                                  fallback=_prompt_tokens(target, samples))
            config = MedusaConfig(hidden_size=decoder.arch.hidden_size, num_heads=options.num_heads or 4,
                                  num_layers=options.num_layers or 1, vocab_size=target.vocab_size,
                                  draft_vocab_size=vocab, logit_softcap=decoder.arch.final_logit_softcap,
                                  own_lm_heads=bool(options.own_lm_heads))
            self.model = MedusaHeads(config)
            grow_own = config.own_lm_heads
        self.vocab_coverage = coverage((s.response_ids for s in samples), ids)
        self.model.set_draft_vocab(ids)
        self.target, self.options = target, options
        self.after_load()
        if grow_own:  # Medusa-1: own projections start as the target's LM head, so training starts from it
            self.model.start_own_heads_from_target()
        layers = options.feature_layers if options.feature_layers is not None else default_aux_layers(target.num_layers)
        self.features = FeatureExtractor(target, layers, feature_cache, cache_budget_bytes)
        self.recent_ranks: deque[torch.Tensor] = deque(maxlen=200)  # per sequence, for the tree's accuracy table

    def after_load(self) -> None:
        decoder = self.target.decoder
        assert decoder is not None
        self.model.attach_target(decoder.head_weight(), head_dtype=torch.float32)
        self.t2d_index = self.model.target_to_draft()
        self.context_head = decoder.head_weight().detach()

    def loss(self, sample: Sample) -> tuple[torch.Tensor, MedusaMetrics]:
        ids = [*sample.prompt_ids, *sample.response_ids]
        feats = self.features.get(ids)
        score_prompt = self.options.score_prompt and self.model.training  # validation: responses only
        # float32 throughout: on CPU it is several times faster than bf16 autocast, backward above all
        loss, metrics = medusa_loss(self.model, torch.tensor(ids), len(sample.prompt_ids), feats.final_hidden,
                                    self.options.loss_decay, self.t2d_index, score_prompt,
                                    self.context_head if self.options.context_vocab else None)
        if not score_prompt:  # the rank table (the saved tree's source) counts generated responses only
            self.recent_ranks.append(metrics.ranks)
        return loss, metrics

    def response_coverage(self, samples: Sequence[Sample]) -> float | None:
        return context_response_coverage(self, samples)

    def rank_accuracy(self) -> list[list[float]] | None:
        """P(head k's rank-r candidate is the label), over the recent sequences."""
        if not self.recent_ranks:
            return None
        counts = torch.stack(list(self.recent_ranks)).sum(0).double()
        table = counts[:, :-1] / counts.sum(-1, keepdim=True).clamp(min=1)
        return [[round(float(x), 5) for x in row] for row in table]

    def save(self, directory: Path, extra: dict) -> None:
        weights = MedusaHeads(self.model.config)
        weights.load_state_dict(self.model.state_dict())
        accuracy = self.rank_accuracy()
        info = {"draft_vocab_coverage": round(self.vocab_coverage, 4),
                "trained_with_context_vocab": self.options.context_vocab}
        if accuracy is not None:
            tree = tree_from_accuracy(accuracy, self.options.tree_nodes)
            info["estimated_tree_acceptance_length"] = round(expected_accepted(accuracy, tree), 3)
        save_medusa(directory, weights.to(self.target.dtype), self.target, accuracy, {**info, **extra})



def train_medusa(target: LoadedModel, samples: list[Sample], output: Path, settings: TrainSettings,
                 options: MedusaTrainOptions, resume: bool = False, feature_cache: Path | None = None,
                 cache_budget_bytes: int = 4 << 30, progress: bool = True,
                 reload: Callable[[], Sequence[Sample]] | None = None, overwrite: bool = False) -> dict:
    objective = MedusaObjective(target, samples, options, feature_cache, cache_budget_bytes)
    return train(objective, samples, output, settings, resume=resume, progress=progress,
                 reload=reload, overwrite=overwrite)
