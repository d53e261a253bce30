"""`specdec train dflash`: a DFlash block drafter for a target, from self-distilled samples."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdec.drafting.dflash_format import load_dflash, save_dflash
from specdec.drafting.dflash_model import DFlashDrafter
from specdec.models.loading import LoadedModel
from specdec.training.context_columns import context_response_coverage
from specdec.training.dflash_objective import default_dflash_config, default_gamma, dflash_loss, sample_anchors
from specdec.training.draft_vocab import coverage, frequent_tokens
from specdec.training.trainer import StepMetrics
from specdec.training.features import FeatureExtractor
from specdec.training.self_distill import Sample
from specdec.training.train_eagle3 import _prompt_tokens
from specdec.training.trainer import TrainSettings, train
from specdec.training.warm_start import check_shape, copy_trained_weights, start_vocabulary


@dataclass
class DFlashTrainOptions:
    block_size: int | None = None  # None: 16, or with init_from the start's (which it may change)
    num_layers: int | None = None  # None: 3, or with init_from the start's
    draft_vocab_size: int | None = None  # None: 32768, or with init_from the start's own vocabulary
    aux_layers: list[int] | None = None  # DFlash convention (layer outputs); default: default_target_layer_ids
    mask_token_id: int | None = None  # default: the tokenizer's mask token, else pad
    num_anchors: int = 64  # blocks per sequence and forward
    loss_gamma: float | None = None  # default_gamma(block_size)
    seed: int = 0
    # runtime hidden indices cached beside the ones DFlash reads (the cache key is the whole set); by default
    # none, and DFlash's default layers are EAGLE-3's tensors, so one feature cache serves both trainings
    feature_layers: list[int] | None = None
    score_prompt: bool = False  # anchors in the prompt too (labels: the target's distribution there)
    init_from: Path | None = None  # start from this DFlash drafter (its layers, weights, mask token and vocabulary)
    # also score the sample's tokens outside the draft vocabulary once seen, as `context_vocab` drafts at
    # inference (context_columns.py)
    context_vocab: bool = True


class DFlashObjective:
    def __init__(self, target: LoadedModel, samples: list[Sample], options: DFlashTrainOptions,
                 feature_cache: Path | None, cache_budget_bytes: int) -> None:
        torch.manual_seed(options.seed)
        if options.init_from is not None:
            start, _ = load_dflash(options.init_from, target)
            c = start.config
            # the block size may change: no weight depends on it (the block's slots differ only by position)
            check_shape({"num_layers": options.num_layers, "mask_token_id": options.mask_token_id},
                        {"num_layers": c.num_hidden_layers, "mask_token_id": c.mask_token_id}, options.init_from)
            if options.aux_layers is not None and list(options.aux_layers) != list(c.aux_layer_ids):
                raise ValueError(f"--init-from {options.init_from} fixes the drafter's shape; asked for aux layers "
                                 f"{options.aux_layers} (it reads {c.aux_layer_ids})")
            ids = start_vocabulary(start.draft_ids(), options.draft_vocab_size, (s.response_ids for s in samples),
                                   target.vocab_size, lambda: _prompt_tokens(target, samples), options.init_from)
            config = replace(c, draft_vocab_size=ids.numel(), block_size=options.block_size or c.block_size)
            self.model = DFlashDrafter(config)
            copy_trained_weights(self.model, start, options.init_from)
        else:
            vocab = min(options.draft_vocab_size or 32768, target.vocab_size)
            ids = frequent_tokens((s.response_ids for s in samples), vocab, target.vocab_size,
                                  fallback=_prompt_tokens(target, samples))
            config = default_dflash_config(target, vocab, options.block_size or 16, options.num_layers or 3,
                                           options.aux_layers, options.mask_token_id)
            self.model = DFlashDrafter(config)
        self.vocab_coverage = coverage((s.response_ids for s in samples), ids)
        self.model.set_draft_vocab(ids)
        self.model.to(target.device)  # float32 weights, trained in float32; the features live there too
        self.target = target
        self.options = options
        self.gamma = options.loss_gamma or default_gamma(config.block_size)
        self.generator = torch.Generator().manual_seed(options.seed)
        self.after_load()
        layers = sorted({*config.runtime_layers, *(options.feature_layers or ())})
        self.features = FeatureExtractor(target, layers, feature_cache, cache_budget_bytes)

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
        # validation sees the same anchors every time; training draws new ones every epoch
        gen = self.generator if self.model.training else torch.Generator().manual_seed(zlib.crc32(sample.id.encode()))
        prompt_len = len(sample.prompt_ids)
        score_prompt = self.options.score_prompt and self.model.training  # validation: responses only
        # validation anchors every response position: greedy_walk follows the chain through all of them
        count = self.options.num_anchors if self.model.training else len(ids)
        anchors = sample_anchors(1 if score_prompt else prompt_len, len(ids), count, gen)
        # float32 throughout: on CPU it is several times faster than bf16 autocast, backward above all
        return dflash_loss(self.model, torch.tensor(ids), feats, anchors, self.t2d_index, self.gamma,
                           prompt_len, self.context_head if self.options.context_vocab else None)

    def response_coverage(self, samples: Sequence[Sample]) -> float | None:
        return context_response_coverage(self, samples)

    def save(self, directory: Path, extra: dict) -> None:
        weights = DFlashDrafter(self.model.config)
        weights.load_state_dict(self.model.state_dict())
        weights = weights.to(self.target.dtype)
        weights.d2t.copy_(self.model.d2t)
        weights.t2d.copy_(self.model.t2d)
        save_dflash(directory, weights, self.target,
                    {"draft_vocab_coverage": round(self.vocab_coverage, 4), "loss_gamma": self.gamma,
                     "num_anchors": self.options.num_anchors,
                     "trained_with_context_vocab": self.options.context_vocab, **extra})



def train_dflash(target: LoadedModel, samples: list[Sample], output: Path, settings: TrainSettings,
                 options: DFlashTrainOptions, resume: bool = False, feature_cache: Path | None = None,
                 cache_budget_bytes: int = 4 << 30, progress: bool = True,
                 reload: Callable[[], Sequence[Sample]] | None = None, overwrite: bool = False) -> dict:
    objective = DFlashObjective(target, samples, options, feature_cache, cache_budget_bytes)
    return train(objective, samples, output, settings, resume=resume, progress=progress,
                 reload=reload, overwrite=overwrite)
