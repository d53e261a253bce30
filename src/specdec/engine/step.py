"""One engine step for a whole batch: propose -> one target forward -> verify -> commit -> feedback.

Every running sequence brings rows to the same target forward: a prefill chunk of its prompt, or its
pending token plus its draft. A chain is the tree with parents -1, 0, 1, ...; plain decoding is the step
with an empty draft. Each sequence keeps its own KV cache, and the batched forward gives each one the
same bits as its forward alone, so every output equals its batch-1 plain output under greedy decoding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.drafting.base import EMPTY_DRAFT, Draft
from specdec.drafting.tree import prune_to_depth, tree_depths
from specdec.engine.sequence import MAX_TOKENS_PER_FORWARD, SequenceState
from specdec.engine.stats import SpecDecodingStats
from specdec.engine.stopping import Finish, StopChecker
from specdec.models.greedy_argmax import greedy_argmax
from specdec.models.runtime import ForwardCall, ForwardResult, forward_batch
from specdec.sampling_params import SamplingParams
from specdec.verification import TargetRows, sample, sampling_probs, verify


@dataclass
class StepOutput:
    new_token_ids: list[int]  # tokens this step added to the output (already cut at a stop)
    finish: Finish | None  # set on the last step
    checker: StopChecker
    stats: SpecDecodingStats = field(repr=False, default_factory=SpecDecodingStats)


@dataclass
class Work:
    """What one sequence does in a step: a prefill chunk of `chunk` prompt tokens, or a verification step
    with at most `draft_limit` draft tokens."""

    seq: SequenceState
    chunk: int = 0
    draft_limit: int = 0
    # rows a tree draft may bring (its first nodes in topological order); None: any, up to draft_limit deep.
    # The auto policy sets it to draft_limit, since it prices a sequence's draft by the rows it adds.
    max_tree_nodes: int | None = None


@dataclass
class _Planned:
    work: Work
    call: ForwardCall
    draft: Draft = field(default_factory=lambda: EMPTY_DRAFT)
    tree: Draft | None = None  # the draft as verified (a tree cut to the request's room), None for a chain
    kept: list[int] | None = None  # original indices of the tree's kept nodes


def first_token(logits: torch.Tensor | None, params: SamplingParams, generator: torch.Generator | None,
                argmax: torch.Tensor | None = None) -> int:
    """The token after the prompt from its last logit row (`argmax`: that row's greedy token, if computed;
    greedy decoding needs only one of the two)."""
    if params.greedy and argmax is not None:
        return int(argmax)
    if logits is None:
        raise ValueError("the first token needs the prompt's last logit row")
    if params.greedy:
        return int(greedy_argmax(logits))
    return sample(sampling_probs(logits[None], params.temperature, params.top_k, params.top_p)[0], generator)


def scores_head_early(seq: SequenceState) -> bool:
    """Whether the sequence, verified alone, uses greedy early exit (the head scored only for rows alive)."""
    return seq.params.greedy and seq.runtime.scores_head_slices


def _draft_all(decoding: Sequence[Work]) -> tuple[list[Draft], dict[str, tuple[float, float]]]:
    """Every decoding sequence's draft, one `propose_batch` per drafting method (one drafter forward for all
    of its sequences where the method has a network); returns the drafts and each sequence's share of the
    drafting time and of its catching up (`Proposer.catch_up_batch`, timed apart)."""
    drafts: list[Draft] = [EMPTY_DRAFT] * len(decoding)
    seconds: dict[str, tuple[float, float]] = {w.seq.request_id: (0.0, 0.0) for w in decoding}
    groups: dict[type, list[int]] = {}
    for i, w in enumerate(decoding):
        if w.seq.proposer is not None and min(w.seq.room, w.draft_limit) > 0:
            groups.setdefault(type(w.seq.proposer), []).append(i)
    for cls, members in groups.items():
        proposers = [decoding[i].seq.proposer for i in members]
        tokens = [decoding[i].seq.tokens for i in members]
        t0 = time.perf_counter()
        cls.catch_up_batch(proposers, tokens)  # type: ignore[attr-defined]
        t1 = time.perf_counter()
        out = cls.propose_batch(proposers, tokens,  # type: ignore[attr-defined]
                                [min(decoding[i].seq.room, decoding[i].draft_limit) for i in members])
        share = ((time.perf_counter() - t0) / len(members), (t1 - t0) / len(members))
        for i, draft in zip(members, out):
            drafts[i] = draft
            seconds[decoding[i].seq.request_id] = share
    return drafts, seconds


def _plan_decode(work: Work, draft: Draft, early_exit: bool) -> _Planned:
    seq = work.seq
    proposer, room = seq.proposer, seq.room
    limit = min(room, work.draft_limit)
    token = seq.tokens[-1]
    rows = None if early_exit else "all"
    if draft.parents is None:
        if len(draft) > limit:
            raise RuntimeError(f"{type(proposer).__name__} drafted {len(draft)} tokens, more than the {limit} allowed")
        call = ForwardCall([token, *draft.tokens], None, seq.capture, rows, argmax=seq.params.greedy,
                           logits=not seq.params.greedy)
        return _Planned(work, call, draft)
    if len(draft) > MAX_TOKENS_PER_FORWARD - 1:  # checked before the cut: independent of max_tokens
        raise RuntimeError(
            f"{type(proposer).__name__} drafted a tree of {len(draft)} nodes, more than {MAX_TOKENS_PER_FORWARD - 1}"
        )
    # deeper nodes could only be accepted past max_tokens
    tree, kept = prune_to_depth(draft, room, work.max_tree_nodes)
    assert tree.parents is not None
    call = ForwardCall([token, *tree.tokens], [-1, *(p + 1 for p in tree.parents)], seq.capture, rows,
                       argmax=seq.params.greedy, logits=not seq.params.greedy)
    return _Planned(work, call, draft, tree, kept)


def _rows_at(result: ForwardResult, kept: list[int], size: int) -> ForwardResult:
    """The forward of a cut tree laid out over the proposer's own draft indices: row kept[j] + 1 holds row
    j + 1, the cut nodes' rows are zeros (they are never on the kept path)."""
    index = torch.tensor([0, *(i + 1 for i in kept)])

    def spread(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros((size + 1, *x.shape[1:])).index_copy_(0, index.to(x.device), x)

    return ForwardResult(
        logits=None if result.logits is None else spread(result.logits),
        hidden={layer: spread(h) for layer, h in result.hidden.items()},
        final_hidden=None if result.final_hidden is None else spread(result.final_hidden),
    )


def _joined(parts: list[ForwardResult]) -> ForwardResult:
    """The prefill chunks' forwards as one forward over the whole prompt (what a proposer's begin() reads)."""
    if len(parts) == 1:
        return parts[0]
    finals = [p.final_hidden for p in parts]
    return ForwardResult(
        logits=parts[-1].logits,
        hidden={layer: torch.cat([p.hidden[layer] for p in parts]) for layer in parts[0].hidden},
        final_hidden=None if any(f is None for f in finals) else torch.cat(finals),  # type: ignore[arg-type]
    )


def run_step(batch: Sequence[Work]) -> dict[str, StepOutput]:
    """Runs one step for every sequence in `batch` (prefill chunks and verification steps together);
    returns the step's output per request id (prefill chunks that do not end the prompt return nothing)."""
    decoding = [w for w in batch if not w.seq.prefilling]
    # Greedy early exit scores the head in slices per sequence; with several sequences one batched head
    # call over every row costs less. Either way the tokens are the same.
    lone = len(batch) == 1 and len(decoding) == 1
    plans: list[_Planned] = []
    drafts, draft_seconds = _draft_all(decoding)
    draft_of = {id(w): d for w, d in zip(decoding, drafts)}
    for work in batch:
        seq = work.seq
        if seq.prefilling:
            end = min(len(seq.prompt), seq.prefilled + work.chunk)
            last = end == len(seq.prompt)
            call = ForwardCall(seq.prompt[seq.prefilled : end], None, seq.capture, "last" if last else None,
                               argmax=seq.params.greedy, logits=not seq.params.greedy)
            plans.append(_Planned(work, call))
        else:
            early = lone and scores_head_early(seq)
            plans.append(_plan_decode(work, draft_of[id(work)], early))
    t1 = time.perf_counter()
    results = forward_batch([p.work.seq.runtime for p in plans], [p.call for p in plans])
    t2 = time.perf_counter()
    outputs: dict[str, StepOutput] = {}
    for plan, result in zip(plans, results):
        seq = plan.work.seq
        if seq.prefilling:
            out = _after_prefill(seq, plan, result)
        else:
            out = _after_verify(seq, plan, result)
            drafting, catching_up = draft_seconds[seq.request_id]
            seq.stats.draft_seconds += drafting
            seq.stats.catch_up_seconds += catching_up
            seq.stats.verify_seconds += t2 - t1
        if out is not None:
            seq.stats.num_generated_tokens = len(seq.checker.output)
            seq.stats.total_seconds = time.perf_counter() - seq.start
            outputs[seq.request_id] = out
    return outputs


def _after_prefill(seq: SequenceState, plan: _Planned, result: ForwardResult) -> StepOutput | None:
    n = len(plan.call.tokens)
    seq.runtime.commit(range(n))
    seq.prefilled += n
    if seq.proposer is not None:
        seq.prefill_parts.append(result)
    if seq.prefilling:
        return None
    token = first_token(None if result.logits is None else result.logits[-1], seq.params, seq.generator,
                        None if result.argmax is None else result.argmax[-1])
    if seq.proposer is not None:
        prefill = _joined(seq.prefill_parts)
        seq.prefill_parts = []
        seq.proposer.begin(seq.prompt, seq.params, seq.generator, seq.capacity, prefill)
    seq.stats.prefill_seconds = time.perf_counter() - seq.start
    seq.tokens = [*seq.prompt, token]
    new = seq.checker.extend([token])
    return StepOutput(new, seq.checker.finish, seq.checker, seq.stats)


def _after_verify(seq: SequenceState, plan: _Planned, result: ForwardResult) -> StepOutput:
    draft, tree = plan.draft, plan.tree
    verified = tree if tree is not None else draft
    runtime = seq.runtime
    if plan.call.logit_rows is None:
        target = TargetRows(final_hidden=result.final_hidden, head_logits=runtime.head_logits,
                            head_max=runtime.head_max, vocab_size=runtime.vocab_size)
    else:
        target = TargetRows(logits=result.logits, argmax=result.argmax)
    start = time.perf_counter()
    outcome = verify(verified.tokens, verified.parents, verified.probs, target, seq.params, seq.generator)
    # a lone greedy sequence scores the head here, row by row (head_max), not in the forward: verification time
    seq.stats.verify_seconds += time.perf_counter() - start
    runtime.commit([0, *(i + 1 for i in outcome.path)])
    if tree is None:
        if seq.proposer is not None:
            seq.proposer.feedback(outcome.num_accepted, result)
        positions = len(draft)
    else:
        assert plan.kept is not None and seq.proposer is not None
        if len(plan.kept) < len(draft):
            result = _rows_at(result, plan.kept, len(draft))
        seq.proposer.feedback(outcome.num_accepted, result, path=[plan.kept[i] for i in outcome.path])
        positions = min(max(tree_depths(draft.parents or []), default=0), seq.room)
    produced = [*(verified.tokens[i] for i in outcome.path), outcome.next_token]
    seq.stats.record_step(len(verified), outcome.num_accepted, positions)
    seq.steps += 1
    seq.tokens.extend(produced)
    new = seq.checker.extend(produced)
    return StepOutput(new, seq.checker.finish, seq.checker, seq.stats)
