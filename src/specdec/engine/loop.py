"""One request through the speculative loop: prefill, then propose -> verify -> commit until it stops.

Plain decoding is the same loop with no proposer (an empty draft every step), over the same runtime:
that is the baseline every speedup is measured against, and what greedy output must equal. Tree drafts
(Draft.parents set) take tree_step.py's path through the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.drafting.base import EMPTY_DRAFT, Draft, Proposer
from specdec.drafting.tree import tree_depths
from specdec.engine.stats import SpecDecodingStats
from specdec.engine.stopping import Finish, StopChecker
from specdec.engine.tree_step import tree_step
from specdec.models.runtime import ModelRuntime
from specdec.sampling_params import SamplingParams
from specdec.verification import Verification, sample, sampling_probs, verify_greedy, verify_sampling
from specdec.verification.greedy_early_exit import verify_greedy_early_exit

# Room kept after prompt + max_tokens for one forward's draft tokens; the cache size depends only on the
# request (never on the method) so that plain and speculative runs attend over identical buffers.
MAX_TOKENS_PER_FORWARD = 64
CAPACITY_ALIGN = 128


def cache_capacity(prompt_len: int, max_tokens: int) -> int:
    need = prompt_len + max_tokens + MAX_TOKENS_PER_FORWARD
    return -(-need // CAPACITY_ALIGN) * CAPACITY_ALIGN


@dataclass
class StepOutput:
    new_token_ids: list[int]  # tokens this step added to the output (already cut at a stop)
    finish: Finish | None  # set on the last step
    checker: StopChecker
    stats: SpecDecodingStats = field(repr=False, default_factory=SpecDecodingStats)


def _next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if params.greedy:
        return int(logits.argmax())
    return sample(sampling_probs(logits[None], params.temperature, params.top_k, params.top_p)[0], generator)


def _verify(
    draft: Draft, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Verification:
    if params.greedy:
        return verify_greedy(draft.tokens, logits)
    target_probs = sampling_probs(logits, params.temperature, params.top_k, params.top_p)
    return verify_sampling(draft.tokens, draft.probs, target_probs, generator)


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
    if not prompt:
        raise ValueError("the prompt is empty")
    if max_model_len is not None and len(prompt) + params.max_tokens > max_model_len:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds max_model_len {max_model_len}"
        )
    if proposer is not None and proposer.num_speculative_tokens >= MAX_TOKENS_PER_FORWARD:
        raise ValueError(f"num_speculative_tokens must be < {MAX_TOKENS_PER_FORWARD}")
    generator = None
    if not params.greedy:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(params.seed if params.seed is not None else int(torch.randint(2**62, ()).item()))
    stats = SpecDecodingStats(num_requests=1, num_prompt_tokens=len(prompt))
    checker = StopChecker(tokenizer, params, eos_token_ids)
    capture = proposer.target_layers if proposer is not None else ()
    capacity = cache_capacity(len(prompt), params.max_tokens)
    start = time.perf_counter()

    runtime.reset(capacity)
    prefill = runtime.prefill(prompt, capture=capture)
    token = _next_token(prefill.logits[-1], params, generator)
    if proposer is not None:
        proposer.begin(prompt, params, generator, capacity, prefill)
    stats.prefill_seconds = time.perf_counter() - start
    tokens = list(prompt) + [token]
    new = checker.extend([token])
    stats.num_generated_tokens = len(checker.output)
    stats.total_seconds = time.perf_counter() - start
    yield StepOutput(new, checker.finish, checker, stats)

    while checker.finish is None:
        room = params.max_tokens - len(checker.output) - 1  # the step's own token always comes on top
        t0 = time.perf_counter()
        draft = proposer.propose(tokens, room) if proposer is not None and room > 0 else EMPTY_DRAFT
        t1 = time.perf_counter()
        if draft.parents is not None and proposer is not None:
            num_draft, produced = tree_step(
                runtime, proposer, draft, token, room, MAX_TOKENS_PER_FORWARD - 1, params, generator, capture
            )
            positions = min(max(tree_depths(draft.parents), default=0), room)
        else:
            if len(draft) > room:
                raise RuntimeError(
                    f"{type(proposer).__name__} drafted {len(draft)} tokens, more than the {room} allowed"
                )
            if params.greedy and runtime.scores_head_slices:  # only the rows up to the first rejection
                verified = runtime.forward([token, *draft.tokens], parents=None, capture=capture, logit_rows=None)
                assert verified.final_hidden is not None
                outcome = verify_greedy_early_exit(draft.tokens, verified.final_hidden, runtime.head_logits,
                                                   runtime.vocab_size)
            else:
                verified = runtime.forward([token, *draft.tokens], parents=None, capture=capture)
                outcome = _verify(draft, verified.logits, params, generator)
            runtime.commit(range(outcome.num_accepted + 1))
            if proposer is not None:
                proposer.feedback(outcome.num_accepted, verified)
            num_draft, produced = len(draft), [*draft.tokens[: outcome.num_accepted], outcome.next_token]
            positions = num_draft
        t2 = time.perf_counter()
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        stats.record_step(num_draft, len(produced) - 1, positions)  # a tree's accepted count: its kept path
        tokens.extend(produced)
        token = produced[-1]
        new = checker.extend(produced)
        stats.num_generated_tokens = len(checker.output)
        stats.total_seconds = time.perf_counter() - start
        yield StepOutput(new, checker.finish, checker, stats)
