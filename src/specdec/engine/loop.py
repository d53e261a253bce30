"""One request on its own: prefill, then propose -> verify -> commit until it stops.

The request is a batch of one through the engine step (step.py), so it runs exactly the code, and gets
exactly the tokens, it gets inside any batch. Plain decoding is the same loop with no proposer (an empty
draft every step): the baseline every speedup is measured against, and what greedy output must equal.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from specdec.drafting.base import Proposer
from specdec.engine.sequence import MAX_TOKENS_PER_FORWARD, SequenceState, cache_capacity, check_request
from specdec.engine.step import StepOutput, Work, run_step
from specdec.models.runtime import ModelRuntime
from specdec.sampling_params import SamplingParams

__all__ = ["MAX_TOKENS_PER_FORWARD", "StepOutput", "cache_capacity", "generate_tokens"]


def generate_tokens(
    runtime: ModelRuntime,
    proposer: Proposer | None,
    prompt: Sequence[int],
    params: SamplingParams,
    tokenizer: Any,
    eos_token_ids: Sequence[int],
    max_model_len: int | None = None,
) -> Iterator[StepOutput]:
    """Runs one request, yielding after the prefill and after every verification step."""
    check_request(prompt, params, proposer.num_speculative_tokens if proposer is not None else 0, max_model_len)
    seq = SequenceState.create("0", prompt, params, runtime, proposer, tokenizer, eos_token_ids)
    while not seq.finished:
        work = Work(seq, chunk=len(prompt), draft_limit=MAX_TOKENS_PER_FORWARD)  # the proposer's own length, within room
        out = run_step([work]).get(seq.request_id)
        if out is not None:
            yield out
