"""The public Python API, in vLLM's shape: LLM(...).generate(prompts, SamplingParams(...))."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec.drafting.base import Proposer
from specdec.drafting.registry import get_method
from specdec.engine.loop import StepOutput, generate_tokens
from specdec.engine.stats import SpecDecodingStats
from specdec.models.loading import DEFAULT_MODEL, LoadedModel, load_model
from specdec.sampling_params import SamplingParams
from specdec.speculative_config import SpeculativeConfig

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
        speculative_config: vLLM-style dict (or SpeculativeConfig); None means plain decoding.
        dtype: "bfloat16" (default) or "float32".
        device: "cpu", "cuda", ...; default CUDA when available.
        max_model_len: longest prompt + max_tokens accepted; default the model's max_position_embeddings.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        speculative_config: dict[str, Any] | SpeculativeConfig | None = None,
        dtype: str = "bfloat16",
        device: str | None = None,
        max_model_len: int | None = None,
        loaded: LoadedModel | None = None,
    ) -> None:
        if isinstance(speculative_config, dict):
            speculative_config = SpeculativeConfig.from_dict(speculative_config)
        self.speculative_config = speculative_config
        self.model = loaded if loaded is not None else load_model(model, dtype=dtype, device=device)
        self.tokenizer = self.model.tokenizer
        self.runtime = self.model.new_runtime()
        self.proposer: Proposer | None = None
        if speculative_config is not None:
            cls = get_method(speculative_config.method)
            self.proposer = cls(speculative_config.options, self.model)
        text_config = self.model.config.get_text_config()
        self.max_model_len = max_model_len or getattr(text_config, "max_position_embeddings", None)
        self.eos_token_ids = _eos_ids(self.model)
        self.stats = SpecDecodingStats()
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def encode(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = [int(t) for t in prompt["prompt_token_ids"]]
            if any(not 0 <= t < self.model.vocab_size for t in ids):
                raise ValueError(f"prompt_token_ids must be in [0, {self.model.vocab_size})")
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
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        iterator = zip(prompts, params_list)
        if use_tqdm:
            from tqdm import tqdm

            iterator = tqdm(iterator, total=len(prompts), desc="generating")
        outputs = []
        for prompt, params in iterator:
            text, ids = self.encode(prompt)
            last = None
            for last in self.stream({"prompt_token_ids": ids}, params):
                pass
            assert last is not None  # generate_tokens always yields at least once
            checker = last.checker
            finish = checker.finish
            outputs.append(
                RequestOutput(
                    request_id=str(next(self._ids)),
                    prompt=text,
                    prompt_token_ids=ids,
                    outputs=[
                        CompletionOutput(
                            index=0,
                            text=checker.text(),
                            token_ids=list(checker.output),
                            finish_reason=finish.reason if finish else None,
                            stop_reason=finish.stop_reason if finish else None,
                        )
                    ],
                    spec_decoding_stats=last.stats,
                )
            )
        return outputs


def _eos_ids(model: LoadedModel) -> list[int]:
    ids: set[int] = set()
    for source in (model.config, model.config.get_text_config(), model.tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)

