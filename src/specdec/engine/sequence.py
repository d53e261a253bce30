"""One request inside the engine: its runtime (own KV cache), its proposer, and where it stands."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.drafting.base import Proposer
from specdec.engine.stats import SpecDecodingStats
from specdec.engine.stopping import StopChecker
from specdec.models.runtime import ForwardResult, ModelRuntime
from specdec.sampling_params import SamplingParams

# Room kept after prompt + max_tokens for one forward's draft tokens; the cache size depends only on the
# request (never on the method or the batch) so that every run of a request attends over identical buffers.
MAX_TOKENS_PER_FORWARD = 64
CAPACITY_ALIGN = 128


def cache_capacity(prompt_len: int, max_tokens: int) -> int:
    need = prompt_len + max_tokens + MAX_TOKENS_PER_FORWARD
    return -(-need // CAPACITY_ALIGN) * CAPACITY_ALIGN


def check_request(prompt: Sequence[int], params: SamplingParams, num_speculative_tokens: int,
                  max_model_len: int | None) -> None:
    if not prompt:
        raise ValueError("the prompt is empty")
    if max_model_len is not None and len(prompt) + params.max_tokens > max_model_len:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds max_model_len {max_model_len}"
        )
    if num_speculative_tokens >= MAX_TOKENS_PER_FORWARD:
        raise ValueError(f"num_speculative_tokens must be < {MAX_TOKENS_PER_FORWARD}")


@dataclass
class SequenceState:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    runtime: ModelRuntime
    proposer: Proposer | None
    checker: StopChecker
    generator: torch.Generator | None = None
    stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    capacity: int = 0
    prefilled: int = 0  # prompt tokens already in the cache
    tokens: list[int] = field(default_factory=list)  # prompt + output so far (the last one pending)
    start: float = 0.0
    prefill_parts: list[ForwardResult] = field(default_factory=list)  # chunk forwards a proposer still needs
    steps: int = 0  # verification steps run
    last_draft_len: int = 0  # the draft length the policy allowed in the last step

    @classmethod
    def create(cls, request_id: str, prompt: Sequence[int], params: SamplingParams, runtime: ModelRuntime,
               proposer: Proposer | None, tokenizer: Any, eos_token_ids: Sequence[int]) -> SequenceState:
        generator = None
        if not params.greedy:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(params.seed if params.seed is not None else int(torch.randint(2**62, ()).item()))
        state = cls(request_id, list(prompt), params, runtime, proposer, StopChecker(tokenizer, params, eos_token_ids),
                    generator)
        state.stats = SpecDecodingStats(num_requests=1, num_prompt_tokens=len(prompt))
        state.capacity = cache_capacity(len(prompt), params.max_tokens)
        state.start = time.perf_counter()
        runtime.reset(state.capacity)
        return state

    @property
    def capture(self) -> tuple[int, ...]:
        return tuple(self.proposer.target_layers) if self.proposer is not None else ()

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt)

    @property
    def finished(self) -> bool:
        return self.checker.finish is not None

    @property
    def room(self) -> int:
        """Draft tokens that could still be used: the step's own token always comes on top."""
        return self.params.max_tokens - len(self.checker.output) - 1
