"""Continuous batching: requests join and leave at step boundaries, and every step is one target forward.

Each step:
1. admits waiting requests (FIFO) while fewer than `max_num_seqs` run and their KV caches fit in
   `kv_cache_memory_bytes` (each sequence has its own fixed-capacity cache: prompt + max_tokens + one
   forward's draft, as at batch 1, which is what keeps its output bit-identical);
2. gives every decoding sequence its draft length (the draft-length policy) and one verification step;
3. fills what is left of `max_num_batched_tokens` with prefill chunks of admitted prompts, shortest first
   (chunked prefill: a long prompt is read in pieces between decode steps, so running streams keep
   producing tokens, and a chunk's attention scores stay within `max_attention_elements`); with
   `prefill_pacing` set (the server sets it), while sequences decode a step's prefill rows are further cut so
   that the step takes at most (1 + prefill_pacing) times a step without them (scheduling/prefill_pacing.py);
4. runs the step (engine/step.py) and retires finished or aborted sequences, whose runtime and proposer
   go back to a pool for the next request.

The same scheduler serves `LLM.generate` (all prompts submitted at once) and `specdec serve`.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.drafting.base import Proposer
from specdec.engine.sequence import MAX_TOKENS_PER_FORWARD, SequenceState, cache_capacity, check_request
from specdec.engine.step import StepOutput, Work, run_step, scores_head_early
from specdec.models.runtime import ModelRuntime
from specdec.sampling_params import SamplingParams
from specdec.scheduling.draft_length import AutoDraftLength, DraftLengthPolicy, FixedDraftLength
from specdec.scheduling.prefill_pacing import PrefillPacing
from specdec.value_checks import as_int

DEFAULT_KV_CACHE_BYTES = 4 << 30
# Rows per step. On a CPU a step's time grows with its rows (compute-bound from a few dozen rows on), so this
# also bounds how long running streams wait while a long prompt is read: with 2048 rows they waited up to 70 s
# beside a 6.7k-token prompt on a 2-core CPU, and 512 rows are a quarter of that arithmetic. Fewer rows per
# chunk cost little: a chunk's weight reads are small beside its arithmetic.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
# Offline (`LLM.generate`, `data generate`) nobody waits on a stream, and larger prefill chunks make fuller
# GEMMs: 20 batched prompts of 100-700 tokens ran about 5% faster with 1024 or 2048 rows than with 512. As
# vLLM, the offline engine takes more rows per step than the server.
OFFLINE_MAX_NUM_BATCHED_TOKENS = 2048
# A step whose catching up took at most this share of its wall time counts as one without catching up
CATCH_UP_NEGLIGIBLE = 0.02


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 32  # sequences running at once
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # rows per step: verification rows first, then prefill chunks
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES  # the running sequences' KV caches together
    max_attention_elements: int = 1 << 24  # a prefill chunk's rows x cache slots (its score matrix)
    prefill_pacing: float | None = None  # while sequences decode, prefill may slow a step by this share at most

    def problems(self) -> list[str]:
        out = []
        for name, least in (("max_num_seqs", 1), ("max_num_batched_tokens", MAX_TOKENS_PER_FORWARD),
                            ("kv_cache_memory_bytes", 1), ("max_attention_elements", 1)):
            value = getattr(self, name)
            number = as_int(value)  # None, floats and bools are refused, not compared or truncated
            if number is None or number < least:
                out.append(f"{name} must be an int >= {least}, got {value!r}")
        return out


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    kv_bytes: int


class BatchScheduler:
    """Runs many requests through one engine; `step()` returns each step's outputs by request id."""

    def __init__(
        self,
        new_runtime: Callable[[], ModelRuntime],
        new_proposer: Callable[[], Proposer] | None,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        kv_bytes_per_token: int,
        policy: DraftLengthPolicy | None = None,
        config: SchedulerConfig | None = None,
        max_model_len: int | None = None,
        num_speculative_tokens: int = 0,
        runtime_pool: list[ModelRuntime] | None = None,
    ) -> None:
        self.config = config or SchedulerConfig()
        problems = self.config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.new_runtime, self.new_proposer = new_runtime, new_proposer
        self.tokenizer, self.eos_token_ids = tokenizer, list(eos_token_ids)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.policy = policy or FixedDraftLength(0)
        self.max_model_len = max_model_len
        self.waiting: deque[_Request] = deque()
        # Set by an offline caller once it has added every request it will: when nothing waits either, the
        # automatic draft length then works towards the batch's end (drain_weights) rather than tokens per second.
        self.closed = False
        self.running: list[SequenceState] = []
        self.kv_in_use = 0
        self._kv: dict[str, int] = {}
        # finished sequences' runtimes (and the KV cache memory they keep), shared by the schedulers of one LLM
        self._runtimes: list[ModelRuntime] = runtime_pool if runtime_pool is not None else []
        self._proposers: list[Proposer] = []
        self._ids = itertools.count()
        self.num_speculative_tokens = num_speculative_tokens
        pacing = self.config.prefill_pacing
        self.pacing = PrefillPacing(pacing) if pacing is not None else None

    # ---- requests ----

    def problem(self, prompt: Sequence[int], params: SamplingParams) -> str | None:
        """Why a request could never run here (naming the limit), or None. Reads no mutable state."""
        try:
            check_request(prompt, params, self.num_speculative_tokens, self.max_model_len)
        except ValueError as exc:
            return str(exc)
        kv = cache_capacity(len(prompt), params.max_tokens) * self.kv_bytes_per_token
        if kv > self.config.kv_cache_memory_bytes:
            return (f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) needs {kv / 2**20:.0f} MiB of "
                    f"KV cache, more than kv_cache_memory_bytes ({self.config.kv_cache_memory_bytes / 2**20:.0f} MiB)")
        return None

    def add(self, prompt: Sequence[int], params: SamplingParams, request_id: str | None = None) -> str:
        """Queues a request; raises ValueError (naming the limit) for one that can never run."""
        problem = self.problem(prompt, params)
        if problem is not None:
            raise ValueError(problem)
        kv = cache_capacity(len(prompt), params.max_tokens) * self.kv_bytes_per_token
        rid = request_id if request_id is not None else str(next(self._ids))
        self.waiting.append(_Request(rid, list(prompt), params, kv))
        return rid

    def abort(self, request_id: str) -> bool:
        """Drops a waiting or running request at the step boundary; the others are unaffected."""
        for r in self.waiting:
            if r.request_id == request_id:
                self.waiting.remove(r)
                return True
        for seq in self.running:
            if seq.request_id == request_id:
                self._retire(seq)
                return True
        return False

    def abort_all(self) -> None:
        self.waiting.clear()
        for seq in list(self.running):
            self._retire(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ----

    def step(self) -> dict[str, StepOutput]:
        self._admit()
        if not self.running:
            return {}
        budget = self.config.max_num_batched_tokens
        decoding = [s for s in self.running if not s.prefilling]
        caps = [min(s.room, MAX_TOKENS_PER_FORWARD - 1) if s.proposer is not None else 0 for s in decoding]
        prefilling = [s for s in self.running if s.prefilling]
        paced = self.pacing is not None and bool(decoding) and bool(prefilling)
        prefill_cap = max(budget - len(decoding), 0)
        if paced:
            prefill_cap = min(prefill_cap, self.pacing.rows())
        prefill_rows = min(sum(self._chunk(s) for s in prefilling), prefill_cap)
        lone = len(decoding) == 1 and not prefill_rows  # run_step verifies a lone greedy sequence early-exit
        early = lone and scores_head_early(decoding[0])
        weights = drain_weights(decoding) if self.closed and not self.waiting else None
        lengths = self.policy.choose([s.stats for s in decoding], caps, prefill_rows, len(prefilling),
                                     early_exit=early, weights=weights) if decoding else []
        work = []
        for seq, k in zip(decoding, lengths):
            reported = k if not isinstance(self.policy, FixedDraftLength) or self.policy.length is not None else (
                min(k, seq.proposer.num_speculative_tokens) if seq.proposer is not None else 0)
            seq.stats.record_choice(reported)
            seq.last_draft_len = k
            nodes = k if isinstance(self.policy, AutoDraftLength) else None  # auto prices a draft by its rows
            work.append(Work(seq, draft_limit=k, max_tree_nodes=nodes))
            budget -= 1 + k
        budget = min(budget, prefill_cap)
        # Shortest remaining prompt first: a short request that arrives while a 30k-token prompt is being
        # read starts at once instead of waiting for the whole long prefill (the long one takes what is left).
        for seq in sorted(prefilling, key=lambda s: len(s.prompt) - s.prefilled):
            if budget > 0:
                chunk = min(self._chunk(seq), budget)
                work.append(Work(seq, chunk=chunk))
                budget -= chunk
        auto = isinstance(self.policy, AutoDraftLength)
        before = {} if not auto else {
            w.seq.request_id: (list(w.seq.stats.accepted_per_position), list(w.seq.stats.drafted_per_position),
                               w.seq.stats.draft_seconds - w.seq.stats.catch_up_seconds, w.seq.stats.num_draft_tokens,
                               w.seq.stats.catch_up_seconds) for w in work}
        started = time.perf_counter()
        outputs = run_step(work)
        if self.pacing is not None and decoding:
            chunked = sum(w.chunk for w in work)
            self.pacing.observe(time.perf_counter() - started, chunked)
        if auto:
            wall = time.perf_counter() - started
            # catching up costs the same whatever is drafted: the policy prices drafts without it
            seconds, tokens, kept, catch_up, levels = 0.0, 0, 0, 0.0, 0
            for w in work:
                if not w.seq.prefilling and w.seq.request_id in before:
                    acc, dr, ds, dt, dc = before[w.seq.request_id]
                    s = w.seq.stats
                    accepted, drafted = _diff(s.accepted_per_position, acc), _diff(s.drafted_per_position, dr)
                    self.policy.observe(accepted, drafted, w.draft_limit, s.num_draft_tokens - dt)
                    levels = max(levels, sum(1 for n in drafted if n > 0))
                    seconds += s.draft_seconds - s.catch_up_seconds - ds
                    tokens += s.num_draft_tokens - dt
                    catch_up += s.catch_up_seconds - dc
                    kept += sum(accepted)
            if not prefill_rows and decoding and tokens == 0:
                self.policy.observe_plain_step(wall - catch_up, len(decoding), early)
            elif not prefill_rows and decoding and catch_up <= CATCH_UP_NEGLIGIBLE * wall:
                # a step that caught up also paid first-call costs (gathering the backlog, packing the
                # drafter's weights): taken as drafting cost, the first step's kept 32 sequences from
                # drafting for 40 steps. A catch-up call with nothing to read still takes microseconds;
                # testing for exactly zero skipped this for every step, and DFlash drafted at a loss
                # (the drafter's own time missed 5 of the 18 ms a drafted token added to a step).
                seconds = max(seconds, self.policy.step_overhead(wall, len(decoding), tokens, kept, early))
            self.policy.observe_drafting(seconds, tokens, levels)  # the whole step's: the drafter's calls serve them all
        for seq in list(self.running):
            if seq.finished:
                self._retire(seq)
        return outputs

    def _chunk(self, seq: SequenceState) -> int:
        """The prompt tokens a prefilling sequence reads next, before the step's token budget: bounded so
        that its attention scores stay within max_attention_elements."""
        return min(len(seq.prompt) - seq.prefilled, max(16, self.config.max_attention_elements // seq.capacity))

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if self.running and self.kv_in_use + req.kv_bytes > self.config.kv_cache_memory_bytes:
                break  # waits for memory; alone it always fits (add() refuses what never would)
            self.waiting.popleft()
            runtime = self._take_runtime()
            proposer = self._take_proposer() if self.new_proposer is not None else None
            seq = SequenceState.create(req.request_id, req.prompt, req.params, runtime, proposer, self.tokenizer,
                                       self.eos_token_ids)
            self.running.append(seq)
            self.kv_in_use += req.kv_bytes
            self._kv[req.request_id] = req.kv_bytes

    def _take_runtime(self) -> ModelRuntime:
        try:
            return self._runtimes.pop()
        except IndexError:  # none left (the pool may be shared with a scheduler on another thread)
            return self.new_runtime()

    def _take_proposer(self) -> Proposer:
        assert self.new_proposer is not None
        return self._proposers.pop() if self._proposers else self.new_proposer()

    def _retire(self, seq: SequenceState) -> None:
        self.running.remove(seq)
        self.kv_in_use -= self._kv.pop(seq.request_id, 0)
        seq.runtime.release()
        self._runtimes.append(seq.runtime)
        if seq.proposer is not None:
            self._proposers.append(seq.proposer)


def drain_weights(decoding: Sequence[SequenceState]) -> list[float]:
    """While a closed batch drains, the run lasts as long as its slowest sequence: each sequence's tokens count
    in proportion to the tokens it has left, against the most any has left. With equal weights, EAGLE-3 at 32
    MT-Bench sequences drafted for the sequences it predicts best, which then finished early, and the ones it
    predicts worst went on alone at about one token per step: 0.92x plain."""
    left = [s.room + 1 for s in decoding]
    most = max(left, default=1)
    return [n / most for n in left]


def _diff(now: list[int], before: list[int]) -> list[int]:
    return [a - (before[i] if i < len(before) else 0) for i, a in enumerate(now)]
