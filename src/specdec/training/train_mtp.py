"""`specdec train mtp`: an external MTP drafter (DeepSeek-V3 style modules) for a target that has none."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdec.drafting.mtp_format import load_mtp, save_mtp
from specdec.drafting.mtp_model import FULL, MTPConfig, MTPDrafter, init_from_target
from specdec.models.loading import LoadedModel
from specdec.training.context_columns import context_response_coverage
from specdec.training.draft_vocab import coverage, frequent_tokens
from specdec.training.eagle3_objective import default_aux_layers
from specdec.training.trainer import StepMetrics
from specdec.training.features import FeatureExtractor
from specdec.training.mtp_objective import mtp_loss, step_weights
from specdec.training.self_distill import Sample
from specdec.training.train_eagle3 import _prompt_tokens
from specdec.training.trainer import TrainSettings, train
from specdec.training.warm_start import check_shape, copy_trained_weights, start_vocabulary


@dataclass
class MTPTrainOptions:
    draft_vocab_size: int | None = None  # None: 32768, or with init_from the start's own vocabulary
    # depth k trains module min(k, num_modules): one module can serve every step; default 1, or the start's
    num_modules: int | None = None
    steps: int = 3  # depths trained
    step_weight_beta: float = 0.6  # depth k weighted beta**(k - 1), normalised
    init_layer: int | None = -1  # target layer the blocks start from (-1: the last); None: random
    # layers cached with the final hidden state (which is all MTP reads): EAGLE-3's by default, so one
    # feature cache serves every training
    feature_layers: list[int] | None = None
    num_speculative_tokens: int = 3  # written into the speculators proposal method
    score_prompt: bool = False  # also train on prompt positions (labels: the target's distribution there)
    init_from: Path | None = None  # start from this MTP drafter (its modules, weights and vocabulary)
    context_vocab: bool = True  # also score the sample's tokens outside the draft vocabulary once seen


class MTPObjective:
    def __init__(self, target: LoadedModel, samples: list[Sample], options: MTPTrainOptions,
                 feature_cache: Path | None, cache_budget_bytes: int) -> None:
        decoder = target.decoder
        if decoder is None:
            raise ValueError("mtp training needs the native runtime (the target's final hidden states)")
        arch = decoder.arch
        torch.manual_seed(0)
        if options.init_from is not None:
            start, _ = load_mtp(options.init_from, target)
            check_shape({"num_modules": options.num_modules}, {"num_modules": start.config.num_modules},
                        options.init_from)
            ids = start_vocabulary(start.draft_ids(), options.draft_vocab_size, (s.response_ids for s in samples),
                                   target.vocab_size, lambda: _prompt_tokens(target, samples), options.init_from)
            self.config = replace(start.config, draft_vocab_size=ids.numel())
            self.model = MTPDrafter(self.config, arch).float()
            copy_trained_weights(self.model, start, options.init_from)
        else:
            vocab = min(options.draft_vocab_size or 32768, target.vocab_size)
            ids = frequent_tokens((s.response_ids for s in samples), vocab, target.vocab_size,
                                  fallback=_prompt_tokens(target, samples))
            layer = None if options.init_layer is None else options.init_layer % arch.num_layers
            self.config = MTPConfig(num_modules=options.num_modules or 1, hidden_size=arch.hidden_size,
                                    vocab_size=target.vocab_size, draft_vocab_size=vocab,
                                    first_layer_index=arch.num_layers,
                                    layer_type=FULL if layer is None else arch.layer_types[layer])
            self.model = MTPDrafter(self.config, arch).float()
            init_from_target(self.model, decoder, layer)
        self.vocab_coverage = coverage((s.response_ids for s in samples), ids)
        self.model.set_draft_vocab(ids)
        self.target, self.options = target, options
        self.weights = step_weights(options.steps, options.step_weight_beta)
        self.after_load()
        layers = options.feature_layers if options.feature_layers is not None else default_aux_layers(target.num_layers)
        self.features = FeatureExtractor(target, layers, feature_cache, cache_budget_bytes)

    def after_load(self) -> None:
        decoder = self.target.decoder
        assert decoder is not None
        self.model.attach_target(decoder, head_dtype=torch.float32)
        self.t2d_index = self.model.target_to_draft()
        self.context_head = decoder.head_weight().detach()

    def loss(self, sample: Sample) -> tuple[torch.Tensor, StepMetrics]:
        ids = [*sample.prompt_ids, *sample.response_ids]
        feats = self.features.get(ids)
        # float32 throughout: on CPU it is several times faster than bf16 autocast, backward above all
        return mtp_loss(self.model, torch.tensor(ids, device=self.target.device), len(sample.prompt_ids),
                        feats.final_hidden, self.weights, self.t2d_index,
                        score_prompt=self.options.score_prompt and self.model.training,
                        context_head=self.context_head if self.options.context_vocab else None)

    def response_coverage(self, samples: Sequence[Sample]) -> float | None:
        return context_response_coverage(self, samples)

    def save(self, directory: Path, extra: dict) -> None:
        weights = MTPDrafter(self.config, self.model.arch)
        weights.load_state_dict(self.model.state_dict())
        save_mtp(directory, weights.to(self.target.dtype), self.target, self.options.num_speculative_tokens,
                 {"draft_vocab_coverage": round(self.vocab_coverage, 4),
                  "train_steps": self.options.steps, "step_weights": [round(w, 4) for w in self.weights],
                  "trained_with_context_vocab": self.options.context_vocab, **extra})



def train_mtp(target: LoadedModel, samples: list[Sample], output: Path, settings: TrainSettings,
              options: MTPTrainOptions, resume: bool = False, feature_cache: Path | None = None,
              cache_budget_bytes: int = 4 << 30, progress: bool = True,
              reload: Callable[[], Sequence[Sample]] | None = None, overwrite: bool = False) -> dict:
    objective = MTPObjective(target, samples, options, feature_cache, cache_budget_bytes)
    return train(objective, samples, output, settings, resume=resume, progress=progress,
                 reload=reload, overwrite=overwrite)
