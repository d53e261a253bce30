"""The request queue and the one worker thread that runs every generation, batched.

The model is not thread-safe, so all model work happens on a single worker thread, which drives the
engine's continuous-batching scheduler (scheduling/scheduler.py, the one `LLM.generate` uses): up to
`max_num_seqs` requests share every target forward, join and leave at step boundaries, and long prompts
are read in chunks between decode steps. Each request keeps its own KV cache and proposer, and the
batched forward gives it the same bits as running alone, so greedy output equals `specdec generate`'s.
Requests wait in a FIFO queue (at most `max_waiting`; beyond that the server answers 429).

A request's handle (serving/generation.py) is shared with its HTTP handler: the worker posts one StepEvent
per step (only the new text) into its mailbox; the handler cancels it when its client disconnects or stops
reading for `stall_timeout` seconds, and the worker aborts it at the next step boundary (or drops it from the
queue before it starts); the others are unaffected. A request counts against the 429 limit until its handler
releases it, after the last event was sent. If the worker thread ever dies, every waiting handler gets an
error, new requests get 503, and the log says why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specdec.api import LLM
from specdec.engine.step import StepOutput
from specdec.engine.stats import SpecDecodingStats
from specdec.serving.errors import APIError
from specdec.serving.generation import Generation, StepEvent
from specdec.scheduling.scheduler import BatchScheduler
from specdec.serving.metrics import ServerMetrics
from specdec.serving.text_stream import TextDeltas

logger = logging.getLogger("specdec.serving")


DEFAULT_STALL_TIMEOUT = 60.0  # seconds a client may leave posted events unread before it is cancelled


@dataclass
class _Running:
    gen: Generation
    deltas: TextDeltas
    last_time: float = 0.0
    prev: tuple[int, int, int, int] = (0, 0, 0, 0)  # steps, drafts, draft tokens, accepted
    prev_per_pos: list[int] = field(default_factory=list)
    prev_choices: list[int] = field(default_factory=list)


class Scheduler:
    def __init__(self, llm: LLM, metrics: ServerMetrics, max_num_seqs: int = 4,
                 max_waiting: int = 64, threads: int | None = None,
                 stall_timeout: float = DEFAULT_STALL_TIMEOUT) -> None:
        if max_num_seqs < 1 or max_waiting < 0 or not stall_timeout > 0:
            raise ValueError("max_num_seqs must be >= 1, max_waiting >= 0 and stall_timeout > 0")
        self.stall_timeout = stall_timeout
        self.llm = llm
        self.batch: BatchScheduler = llm.new_scheduler(max_num_seqs=max_num_seqs)
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting
        self.threads = threads
        self.cond = threading.Condition()
        self.waiting: deque[Generation] = deque()
        self.running: dict[str, _Running] = {}
        self.active = 0  # requests submitted and not yet released by their handlers
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.died: BaseException | None = None  # what ended the worker thread, if it died

    # ---- called from the event loop ----

    def submit(self, gen: Generation) -> None:
        problem = self.batch.problem(gen.prompt_ids, gen.params)  # pure: safe off the worker thread
        if problem is not None:
            raise APIError(400, problem, code="request_too_large")
        with self.cond:
            if self.stopping:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            if not self.alive:
                raise worker_down(self.died)
            if self.active >= self.max_num_seqs + self.max_waiting:
                raise APIError(
                    429,
                    f"too many requests: {self.active} in flight, the most this server takes (--max-num-seqs "
                    f"{self.max_num_seqs} running + --max-waiting {self.max_waiting} queued); retry later",
                    code="queue_full",
                )
            self.active += 1
            self.metrics.in_flight_gauge.set(self.active)
            self.waiting.append(gen)
            self.metrics.waiting_gauge.set(len(self.waiting))
            self.cond.notify()

    def cancel(self, gen: Generation) -> None:
        if gen.done:
            return
        gen.cancelled.set()
        with self.cond:
            self.cond.notify()

    def release(self, gen: Generation) -> None:
        """The handler is done with `gen` (its response is sent, or its client left): it stops counting
        against the 429 limit. Idempotent; a generation still running is cancelled."""
        self.cancel(gen)
        with self.cond:
            if gen.released:
                return
            gen.released = True
            self.active -= 1
            self.metrics.in_flight_gauge.set(self.active)

    @property
    def alive(self) -> bool:
        # `died` is set before the failed requests are told, so the thread may still be winding down then
        return self.thread is not None and self.thread.is_alive() and self.died is None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="specdec-worker", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread is not None:
            self.thread.join(timeout)

    # ---- the worker thread ----

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - whatever ends the worker, no handler may wait forever
            self.died = exc
            logger.critical("the generation worker died (%s: %s); failing %d running and %d queued requests; "
                            "/health and new requests answer 503 until the server is restarted",
                            type(exc).__name__, exc, len(self.running), len(self.waiting), exc_info=True)
            with self.cond:
                gens = [entry.gen for entry in self.running.values()] + list(self.waiting)
                self.running.clear()
                self.waiting.clear()
            for gen in gens:
                gen.post(StepEvent("", 0, error=worker_down(exc)))

    def _serve(self) -> None:
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)  # OpenMP settings are per thread: set them here too
        while True:
            with self.cond:
                while True:
                    if self.stopping:
                        self._abort_all()
                        return
                    self._drop_cancelled_waiting()
                    room = self.max_num_seqs - len(self.running)
                    admitted = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
                    if admitted or self.running:
                        break
                    self.cond.wait()
                self.metrics.waiting_gauge.set(len(self.waiting))
            for gen in admitted:
                self._admit(gen)
            now = time.monotonic()
            for rid, entry in list(self.running.items()):
                unread = entry.gen.unread_for(now)
                if unread > self.stall_timeout and not entry.gen.cancelled.is_set():
                    logger.warning("request %s: its client has read nothing for %.0f s; cancelling it", rid, unread)
                    entry.gen.cancelled.set()
                if entry.gen.cancelled.is_set():
                    self.batch.abort(rid)
                    self._record_abort(entry.gen)
                    del self.running[rid]
            self.metrics.running_gauge.set(len(self.running))
            if not self.running:
                continue
            try:
                outputs = self.batch.step()
            except Exception as exc:  # a bug or a model failure: fail the batch's requests, keep serving
                logger.exception("engine step failed")
                for rid, entry in list(self.running.items()):
                    self.batch.abort(rid)
                    entry.gen.post(StepEvent("", 0, error=exc))
                    del self.running[rid]
                continue
            for rid, out in outputs.items():
                entry = self.running.get(rid)
                if entry is not None:
                    self._emit(rid, entry, out)
            self.metrics.running_gauge.set(len(self.running))

    def _drop_cancelled_waiting(self) -> None:
        kept = deque(g for g in self.waiting if not g.cancelled.is_set())
        for gen in self.waiting:
            if gen.cancelled.is_set():
                self._record_abort(gen)
        self.waiting = kept

    def _admit(self, gen: Generation) -> None:
        try:
            self.batch.add(gen.prompt_ids, gen.params, request_id=gen.request_id)
        except Exception as exc:
            logger.exception("could not start request %s", gen.request_id)
            gen.post(StepEvent("", 0, error=exc))
            return
        self.running[gen.request_id] = _Running(gen, TextDeltas(gen.params.stop))
        self.metrics.h["queue_time"].observe(time.monotonic() - gen.arrival)
        self.metrics.c["prompt_tokens"].inc(len(gen.prompt_ids))

    def _emit(self, rid: str, entry: _Running, out: StepOutput) -> None:
        gen, m = entry.gen, self.metrics
        now = time.monotonic()
        s = out.stats
        counts = (s.num_steps, s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens)
        d = [a - b for a, b in zip(counts, entry.prev)]
        per_pos = _diff(s.accepted_per_position, entry.prev_per_pos)
        m.record_step(d[0], d[1], d[2], d[3], per_pos)
        m.record_draft_lengths(_diff(s.chosen_draft_lengths, entry.prev_choices))
        entry.prev, entry.prev_per_pos = counts, list(s.accepted_per_position)
        entry.prev_choices = list(s.chosen_draft_lengths)
        n = len(out.new_token_ids)
        m.record_tokens(n)
        if entry.last_time == 0.0:
            m.h["ttft"].observe(now - gen.arrival)
        elif n:
            gap = (now - entry.last_time) / n
            for _ in range(n):
                m.h["itl"].observe(gap)
        entry.last_time = now
        finish, checker = out.finish, out.checker
        delta = entry.deltas.update(*checker.stream_text(), finish is not None)
        event = StepEvent(delta, len(checker.output))
        if finish is not None:
            event.finish_reason, event.stop_reason = finish.reason, finish.stop_reason
            event.stats, event.text = _copy_stats(s), checker.text()
            m.h["e2e"].observe(now - gen.arrival)
            m.request_success.labels(**m.labels, finished_reason=finish.reason).inc()
            del self.running[rid]
        gen.post(event)

    def _record_abort(self, gen: Generation) -> None:
        self.metrics.request_success.labels(**self.metrics.labels, finished_reason="abort").inc()
        gen.post(StepEvent("", 0, finish_reason="abort"))

    def _abort_all(self) -> None:
        for rid, entry in list(self.running.items()):
            self.batch.abort(rid)
            self._record_abort(entry.gen)
        self.running.clear()
        for gen in self.waiting:
            self._record_abort(gen)
        self.waiting.clear()


def worker_down(cause: BaseException | None) -> APIError:
    why = f" (it died: {type(cause).__name__}: {cause})" if cause is not None else ""
    return APIError(503, f"the generation worker is not running{why}; the server must be restarted",
                    code="worker_down")


def _diff(now: list[int], before: list[int]) -> list[int]:
    return [a - (before[i] if i < len(before) else 0) for i, a in enumerate(now)]


def _copy_stats(s: SpecDecodingStats) -> SpecDecodingStats:
    out = SpecDecodingStats()
    out.merge(s)
    return out
