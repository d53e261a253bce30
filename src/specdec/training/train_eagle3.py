"""`specdec train eagle3`: an EAGLE-3 drafter for a target, from self-distilled samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdec.drafting.eagle3_format import load_eagle3, save_eagle3
from specdec.drafting.eagle3_model import Eagle3Drafter
from specdec.models.loading import LoadedModel
from specdec.training.context_columns import context_response_coverage
from specdec.training.draft_vocab import coverage, frequent_tokens
from specdec.training.eagle3_objective import (
    default_eagle3_config,
    ttt_loss,
)
from specdec.training.features import FeatureExtractor
from specdec.training.self_distill import Sample
from specdec.training.trainer import StepMetrics, TrainSettings, train
from specdec.training.warm_start import copy_trained_weights, start_vocabulary


@dataclass
class Eagle3TrainOptions:
    draft_vocab_size: int | None = None  # None: 32768, or with init_from the start's own vocabulary
    aux_layers: list[int] | None = None
    ttt_steps: int = 4
    loss_decay: float = 0.8
    noise_std: float = 0.0
    num_speculative_tokens: int = 5  # written into the speculators proposal method
    score_prompt: bool = False  # also train on prompt positions (labels: the target's distribution there)
    init_from: Path | None = None  # start from this drafter's weights and vocabulary (fine-tuning)
    # also train over the sample's tokens outside the draft vocabulary, as `context_vocab` drafts at
    # inference (context_columns.py): teaches copying rare tokens from the prompt
    context_vocab: bool = True


class Eagle3Objective:
    def __init__(self, target: LoadedModel, samples: list[Sample], options: Eagle3TrainOptions,
                 feature_cache: Path | None, cache_budget_bytes: int) -> None:
        torch.manual_seed(0)
        if options.init_from is not None:
            start, _ = load_eagle3(options.init_from, target)
            ids = start_vocabulary(start.draft_ids(), options.draft_vocab_size, (s.response_ids for s in samples),
                                   target.vocab_size, lambda: _prompt_tokens(target, samples), options.init_from)
            config = replace(start.config, draft_vocab_size=ids.numel())
            self.model = Eagle3Drafter(config)
            copy_trained_weights(self.model, start, options.init_from)
            self.model.set_draft_vocab(ids)
        else:
            vocab = min(options.draft_vocab_size or 32768, target.vocab_size)
            ids = frequent_tokens((s.response_ids for s in samples), vocab, target.vocab_size,
                                  fallback=_prompt_tokens(target, samples))
            config = default_eagle3_config(target, vocab, options.aux_layers)
            self.model = Eagle3Drafter(config)
            self.model.set_draft_vocab(ids)
        self.vocab_coverage = coverage((s.response_ids for s in samples), ids)
        decoder = target.decoder
        assert decoder is not None
        self.target = target
        self.after_load()
        self.options = options
        self.features = FeatureExtractor(target, config.aux_layer_ids, feature_cache, cache_budget_bytes)

    def after_load(self) -> None:
        decoder = self.target.decoder
        assert decoder is not None
        self.model.attach_target(decoder.embed.weight, decoder.head_weight(), decoder.arch.embed_scale or 1.0,
                                 head_dtype=torch.float32)
        self.t2d_index = self.model.target_to_draft()
        self.context_head = decoder.head_weight().detach()

    def loss(self, sample: Sample) -> tuple[torch.Tensor, StepMetrics]:
        ids = [*sample.prompt_ids, *sample.response_ids]
        feats = self.features.get(ids)
        # float32 throughout: on CPU it is several times faster than bf16 autocast, backward above all
        return ttt_loss(self.model, torch.tensor(ids), len(sample.prompt_ids), feats, self.options.ttt_steps,
                        self.options.loss_decay, self.t2d_index,
                        self.options.noise_std if self.model.training else 0.0,
                        # validation scores generated responses only, comparable across runs
                        score_prompt=self.options.score_prompt and self.model.training,
                        context_head=self.context_head if self.options.context_vocab else None)

    def response_coverage(self, samples: Sequence[Sample]) -> float | None:
        """Share of response tokens the objective scores: in the draft vocabulary, or (with context_vocab)
        already seen in the sample."""
        return context_response_coverage(self, samples)

    def save(self, directory: Path, extra: dict) -> None:
        weights = Eagle3Drafter(self.model.config)
        weights.load_state_dict(self.model.state_dict())
        weights = weights.to(self.target.dtype)
        weights.d2t.copy_(self.model.d2t)
        weights.t2d.copy_(self.model.t2d)
        save_eagle3(directory, weights, self.target, self.options.num_speculative_tokens,
                    {"draft_vocab_coverage": round(self.vocab_coverage, 4),
                     "trained_with_context_vocab": self.options.context_vocab, **extra})


def _prompt_tokens(target: LoadedModel, samples: list[Sample]) -> list[list[int]]:
    """Tokens of the samples' prompts and of the training corpora's prompts: ranks the draft-vocab slots
    the (still small) responses leave open by tokens the target will meet, not by lowest id."""
    out = [list(s.prompt_ids) for s in samples]
    try:
        from specdec.training.prompt_sources import build_prompts

        texts = ["\n".join(p.turns) for p in build_prompts()]
        out += [list(ids) for ids in target.tokenizer(texts).input_ids]
    except FileNotFoundError:
        pass  # no corpora here: the samples' prompts alone
    return out



def train_eagle3(target: LoadedModel, samples: list[Sample], output: Path, settings: TrainSettings,
                 options: Eagle3TrainOptions, resume: bool = False, feature_cache: Path | None = None,
                 cache_budget_bytes: int = 4 << 30, progress: bool = True,
                 reload: Callable[[], Sequence[Sample]] | None = None, overwrite: bool = False) -> dict:
    objective = Eagle3Objective(target, samples, options, feature_cache, cache_budget_bytes)
    return train(objective, samples, output, settings, resume=resume, progress=progress,
                 reload=reload, overwrite=overwrite)
