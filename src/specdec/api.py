"""The public Python API, in vLLM's shape: LLM(...).generate(prompts, SamplingParams(...))."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec.drafting.base import Proposer
from specdec.drafting.registry import get_method
from specdec.engine.loop import StepOutput, generate_tokens
from specdec.engine.stats import SpecDecodingStats
from specdec.models.loading import DEFAULT_MODEL, LoadedModel, load_model
from specdec.models.runtime import ModelRuntime
from specdec.quantization.apply import check_mode
from specdec.sampling_params import SamplingParams
from specdec.scheduling.cost_curve import CostCurve, measure_cost_curve, sample_tokens
from specdec.scheduling.draft_length import (
    AutoDraftLength,
    DraftLengthByBatchSize,
    DraftLengthPolicy,
    FixedDraftLength,
)
from specdec.scheduling.scheduler import (
    DEFAULT_KV_CACHE_BYTES,
    OFFLINE_MAX_NUM_BATCHED_TOKENS,
    BatchScheduler,
    SchedulerConfig,
)
from specdec.speculative_config import SpeculativeConfig
from specdec.value_checks import as_int, token_ids

Prompt = str | dict[str, Any]  # text, or {"prompt_token_ids": [...]} like vLLM's TokensPrompt


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" or "length"
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    spec_decoding_stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)


class LLM:
    """A target model, optionally with a drafting method, that generates text.

    Args:
        model: "gemma-3-270m" (default), a GGUF file, a local Hugging Face folder or a hub id.
        speculative_config: vLLM-style dict, the same as JSON text, or a SpeculativeConfig; None means plain
            decoding.
        dtype: "bfloat16" (default) or "float32".
        device: "cpu", "cuda", ...; default CUDA when available.
        max_model_len: longest prompt + max_tokens accepted (>= 2); None: the model's max_position_embeddings.
        max_num_seqs: sequences `generate` runs at once in one batched forward (continuous batching).
        max_num_batched_tokens: rows per step (verification rows, then prefill chunks); the server's default
            is smaller (512), so running streams wait less beside a long prompt.
        kv_cache_memory_bytes: the running sequences' KV caches together (admission waits beyond it).
        quantization: None (dense weights), "int8" (per output channel), "int4" (4-bit groups of 32,
            activations per row after SmoothQuant), "w8a8_int8"
            (int8 weights, activations per row after SmoothQuant) or "gguf" (a
            GGUF file's own quantized tensors, e.g. the default model's Q4_K_M), vLLM's key: the linear
            layers and LM head run quantized in a row-invariant kernel, so speculation stays lossless.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        speculative_config: dict[str, Any] | str | SpeculativeConfig | None = None,
        dtype: str = "bfloat16",
        device: str | None = None,
        max_model_len: int | None = None,
        loaded: LoadedModel | None = None,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = OFFLINE_MAX_NUM_BATCHED_TOKENS,
        kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES,
        quantization: str | None = None,
    ) -> None:
        # a drafter's stored default for a bare config may depend on what the target's rows cost
        target_quantization = quantization if quantization is not None or loaded is None else loaded.quantization
        speculative_config = SpeculativeConfig.from_value(speculative_config, target_quantization,
                                                          device if loaded is None else loaded.device)
        self.speculative_config = speculative_config
        # every argument is checked before the (slow) model load
        if max_model_len is not None:
            max_model_len = _check_max_model_len(max_model_len)
        self.scheduler_config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, kv_cache_memory_bytes)
        problems = self.scheduler_config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        check_mode(quantization)
        if loaded is not None and quantization is not None and loaded.quantization != quantization:
            raise ValueError(f"quantization={quantization!r} does not match the loaded model's {loaded.quantization!r}")
        self.model = loaded if loaded is not None else load_model(model, dtype=dtype, device=device,
                                                                   quantization=quantization)
        self.tokenizer = self.model.tokenizer
        self.runtime = self.model.new_runtime()
        self.proposer: Proposer | None = None
        # builds more proposers like a `proposer` set by hand (with no speculative_config), so that it can
        # run batched; without it such a proposer runs one sequence at a time
        self.proposer_factory: Callable[[], Proposer] | None = None
        if speculative_config is not None:
            cls = get_method(speculative_config.method)
            self.proposer = cls(speculative_config.options, self.model)
        text_config = self.model.config.get_text_config()
        if max_model_len is None:
            max_model_len = getattr(text_config, "max_position_embeddings", None)
        self.max_model_len = max_model_len
        self.eos_token_ids = _eos_ids(self.model)
        self.stats = SpecDecodingStats()
        self._ids = itertools.count()
        self._policy: DraftLengthPolicy | None = None
        self._scheduler: BatchScheduler | None = None
        self._runtime_pool: list[ModelRuntime] = []  # finished sequences' runtimes, for any of its schedulers
        self._scheduler_proposer: Proposer | None = None

    @property
    def draft_length_policy(self) -> DraftLengthPolicy:
        """The draft length per sequence and step; "auto" measures the target's cost curve on first use."""
        if self._policy is None:
            self._policy = self._make_policy()
        return self._policy

    def _make_policy(self) -> DraftLengthPolicy:
        c = self.speculative_config
        if c is None:  # plain decoding, or a proposer set by hand: whatever it drafts
            return FixedDraftLength(None)
        if c.by_batch_size:
            return DraftLengthByBatchSize(c.by_batch_size, c.num_speculative_tokens)
        if c.auto:
            return AutoDraftLength(self.cost_curve(), c.num_speculative_tokens,
                                   continuation_prior=get_method(c.method).continuation_prior)
        return FixedDraftLength(None)

    def cost_curve(self) -> CostCurve:
        """The target's measured forward cost against rows, shared by every LLM over the same loaded model."""
        curve = getattr(self.model, "cost_curve", None)
        if curve is None:
            largest = self.scheduler_config.max_num_seqs * (self.speculative_config.num_speculative_tokens + 1
                                                            if self.speculative_config else 1)
            rows = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n < 2 * largest] or [1, 2]
            curve = measure_cost_curve(self.model.new_runtime, capacity=512, row_counts=rows, context=64,
                                       text=sample_tokens(self.model.tokenizer))
            self.model.cost_curve = curve  # type: ignore[attr-defined]
        return curve

    def new_proposer(self) -> Proposer:
        if self.speculative_config is None and self.proposer_factory is not None:
            return self.proposer_factory()
        if self.speculative_config is None:
            raise ValueError("plain decoding has no proposer")
        return get_method(self.speculative_config.method)(self.speculative_config.options, self.model)

    @property
    def scheduler(self) -> BatchScheduler:
        """The continuous-batching scheduler `generate` runs on (kept from call to call, with its runtimes
        and proposers, until `proposer` is replaced)."""
        if self._scheduler is None or self._scheduler_proposer is not self.proposer:
            self._scheduler = self.new_scheduler()
            self._scheduler_proposer = self.proposer
        return self._scheduler

    def new_scheduler(self, max_num_seqs: int | None = None) -> BatchScheduler:
        """A continuous-batching scheduler over this model and method (what `generate` and the server use).

        Each running sequence gets its own proposer: this LLM's `proposer` first, then new ones built from
        the speculative config or `proposer_factory`. A proposer set by hand with neither cannot be copied,
        so its scheduler runs one sequence at a time."""
        config = self.scheduler_config
        spec, own = self.speculative_config, self.proposer
        if own is not None and spec is None and self.proposer_factory is None:
            max_num_seqs = 1
        if max_num_seqs is not None:
            config = dataclasses.replace(config, max_num_seqs=max_num_seqs)
        first = [own] if own is not None else []

        def new_proposer() -> Proposer:
            return first.pop() if first else self.new_proposer()

        num = own.num_speculative_tokens if own is not None else 0
        return BatchScheduler(
            self.model.new_runtime, new_proposer if own is not None else None, self.tokenizer,
            self.eos_token_ids, self.model.kv_bytes_per_token, self.draft_length_policy, config, self.max_model_len,
            num_speculative_tokens=num, runtime_pool=self._runtime_pool,
        )

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def encode(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = token_ids(prompt["prompt_token_ids"], "prompt_token_ids", self.model.vocab_size)
            return prompt.get("prompt"), ids
        raise ValueError("a prompt is a string or a dict with 'prompt_token_ids'")

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[StepOutput]:
        """Yields after every step with the tokens it added; the last item has `finish` set."""
        _, ids = self.encode(prompt)
        steps = generate_tokens(
            self.runtime, self.proposer, ids, sampling_params or SamplingParams(), self.tokenizer,
            self.eos_token_ids, self.max_model_len,
        )
        last = None
        for last in steps:
            yield last
        if last is not None:
            self.stats.merge(last.stats)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = _params_list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        encoded = [self.encode(p) for p in prompts]
        scheduler = self.scheduler
        if scheduler.has_unfinished:
            raise RuntimeError("generate is already running on this LLM")
        last: dict[str, StepOutput] = {}
        progress = None
        try:
            ids = [scheduler.add(tokens, params) for (_, tokens), params in zip(encoded, params_list)]
            scheduler.closed = True
            if use_tqdm:
                from tqdm import tqdm

                progress = tqdm(total=len(prompts), desc="generating")
            while scheduler.has_unfinished:
                for rid, out in scheduler.step().items():
                    last[rid] = out
                    if out.finish is not None and progress is not None:
                        progress.update(1)
        finally:
            scheduler.abort_all()  # after a failure: nothing of this call stays queued
            scheduler.closed = False
            if progress is not None:
                progress.close()
        outputs = []
        for rid, (text, tokens) in zip(ids, encoded):
            step = last[rid]
            self.stats.merge(step.stats)
            outputs.append(_request_output(str(next(self._ids)), text, tokens, step))
        return outputs


def _check_max_model_len(value: Any) -> int:
    # an explicit 0 once meant "the default" (a falsy test); the smallest usable length is one prompt token
    # plus one generated token
    length = as_int(value)
    if length is None or length < 2:
        raise ValueError(f"max_model_len must be an int >= 2 (or None for the model's own), got {value!r}")
    return length


def _params_list(value: Any) -> list[SamplingParams]:
    items = None if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable) else list(value)
    if items is None or not all(isinstance(p, SamplingParams) for p in items):
        raise ValueError(f"sampling_params must be a SamplingParams or a list of them, got {type(value).__name__}")
    return items


def _request_output(request_id: str, prompt: str | None, prompt_ids: list[int], step: StepOutput) -> RequestOutput:
    checker, finish = step.checker, step.checker.finish
    completion = CompletionOutput(
        index=0,
        text=checker.text(),
        token_ids=list(checker.output),
        finish_reason=finish.reason if finish else None,
        stop_reason=finish.stop_reason if finish else None,
    )
    return RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=prompt_ids, outputs=[completion],
                         spec_decoding_stats=step.stats)


def _eos_ids(model: LoadedModel) -> list[int]:
    ids: set[int] = set()
    for source in (model.config, model.config.get_text_config(), model.tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)

