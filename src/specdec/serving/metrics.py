"""Prometheus metrics: vLLM's names under our `specdec:` prefix, plus sliding-window gauges for alarms.

Counters (updated after every verification step, so they are live during long generations):

    specdec:spec_decode_num_drafts_total                     steps that had a non-empty draft
    specdec:spec_decode_num_draft_tokens_total               drafted tokens
    specdec:spec_decode_num_accepted_tokens_total            accepted draft tokens
    specdec:spec_decode_num_accepted_tokens_per_pos_total{position}   accepted tokens at draft position i (0-based)
    specdec:prompt_tokens_total, specdec:generation_tokens_total
    specdec:request_success_total{finished_reason}          stop | length | abort (client gone)
    specdec:request_rejected_total{status}                  error responses (4xx/5xx) by status code

Gauges:

    specdec:num_requests_running, specdec:num_requests_waiting
    specdec:num_requests_in_flight             accepted requests not yet fully answered: running, waiting, and
                                               finished ones whose response is still being sent (the 429 limit)
    specdec:spec_decode_acceptance_rate        accepted / drafted tokens over the last --metrics-window seconds
    specdec:spec_decode_efficiency             vLLM's system efficiency over the same window:
                                               (accepted + drafts) / (drafts * (K + 1)), K = num_speculative_tokens;
                                               emitted tokens / the most the drafting steps could have emitted
    specdec:spec_decode_mean_acceptance_length tokens per target forward over the window (all steps,
                                               n-gram misses included): the wall-clock gain's upper bound

The window gauges are NaN when the window holds no drafting step (idle server, or plain decoding), so an
alarm like `specdec:spec_decode_acceptance_rate < 0.3` does not fire on an idle server.

Histograms (seconds): specdec:time_to_first_token_seconds, specdec:inter_token_latency_seconds (a step that
emits m tokens after a gap g is m observations of g / m), specdec:e2e_request_latency_seconds,
specdec:request_queue_time_seconds.

Every metric carries a `model_name` label, as vLLM's do.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics, generate_latest,
)
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the /metrics route)

PREFIX = "specdec:"
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class SlidingWindow:
    """Per-second buckets of (steps, drafts, draft tokens, accepted tokens) over the last `seconds`."""

    def __init__(self, seconds: float, clock=time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.buckets: deque[list[float]] = deque()  # [second, steps, drafts, draft_tokens, accepted]
        self.lock = threading.Lock()

    def add(self, steps: int, drafts: int, draft_tokens: int, accepted: int) -> None:
        second = math.floor(self.clock())
        with self.lock:
            if not self.buckets or self.buckets[-1][0] != second:
                self.buckets.append([second, 0, 0, 0, 0])
            b = self.buckets[-1]
            b[1] += steps
            b[2] += drafts
            b[3] += draft_tokens
            b[4] += accepted
            self._trim()

    def totals(self) -> tuple[int, int, int, int]:
        with self.lock:
            self._trim()
            sums = [0, 0, 0, 0]
            for b in self.buckets:
                for i in range(4):
                    sums[i] += b[i + 1]
            return tuple(int(s) for s in sums)  # type: ignore[return-value]

    def _trim(self) -> None:
        horizon = self.clock() - self.seconds
        while self.buckets and self.buckets[0][0] + 1 <= horizon:
            self.buckets.popleft()


class ServerMetrics:
    def __init__(self, model_name: str, num_speculative_tokens: int, window_seconds: float = 60.0) -> None:
        disable_created_metrics()  # no *_created series: counters and histograms only, as vLLM exports them
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        self.k = num_speculative_tokens
        self.window = SlidingWindow(window_seconds)
        labels = ["model_name"]
        self.labels = {"model_name": model_name}
        r = self.registry

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(PREFIX + name, doc, [*labels, *extra], registry=r)

        self.num_drafts = counter("spec_decode_num_drafts", "Verification steps that had a non-empty draft.")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens by draft position (0-based).", ["position"]
        )
        self.chosen_draft_length = counter(
            "spec_decode_chosen_draft_length",
            "Verification steps by the draft length the draft-length policy allowed (num_speculative_tokens: "
            "fixed, per batch size, or auto).", ["length"])
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of the requests that started generating.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.request_success = counter("request_success", "Finished requests by finish reason.", ["finished_reason"])
        self.request_rejected = counter("request_rejected", "Error responses by HTTP status.", ["status"])
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Arrival to first token.", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds",
                             "Time per output token after the first (a step's gap shared by its tokens).", labels,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to last token.", labels,
                             buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram(PREFIX + "request_queue_time_seconds", "Arrival to the start of generation.",
                                    labels, buckets=E2E_BUCKETS, registry=r)
        self.running = Gauge(PREFIX + "num_requests_running", "Requests generating (sharing every batched forward).",
                             labels, registry=r)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests queued for a generation slot.", labels,
                             registry=r)
        self.in_flight = Gauge(PREFIX + "num_requests_in_flight",
                               "Accepted requests not yet fully answered (running, waiting, or still sending).",
                               labels, registry=r)
        acceptance = Gauge(PREFIX + "spec_decode_acceptance_rate",
                           f"Accepted / drafted tokens over the last {window_seconds:g} s (NaN: no drafts).",
                           labels, registry=r)
        efficiency = Gauge(PREFIX + "spec_decode_efficiency",
                           f"(accepted + drafts) / (drafts * (K+1)) over the last {window_seconds:g} s, K={self.k} "
                           "(vLLM's system efficiency; NaN: no drafts).", labels, registry=r)
        mal = Gauge(PREFIX + "spec_decode_mean_acceptance_length",
                    f"Tokens per target forward over the last {window_seconds:g} s (NaN: no steps).", labels,
                    registry=r)
        acceptance.labels(**self.labels).set_function(self.window_acceptance_rate)
        efficiency.labels(**self.labels).set_function(self.window_efficiency)
        mal.labels(**self.labels).set_function(self.window_mean_acceptance_length)
        # children created up front, so every series exists (at 0) from the first scrape
        self.c = {
            name: getattr(self, name).labels(**self.labels)
            for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "prompt_tokens", "generation_tokens")
        }
        self.h = {name: getattr(self, name).labels(**self.labels) for name in ("ttft", "itl", "e2e", "queue_time")}
        for pos in range(self.k):
            self.accepted_per_pos.labels(**self.labels, position=str(pos))
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(**self.labels, finished_reason=reason)
        self.running_gauge = self.running.labels(**self.labels)
        self.waiting_gauge = self.waiting.labels(**self.labels)
        self.in_flight_gauge = self.in_flight.labels(**self.labels)

    # ---- updates (from the worker thread and the event loop; prometheus_client is thread-safe) ----

    def record_step(self, steps: int, drafts: int, draft_tokens: int, accepted: int, per_pos: Sequence[int]) -> None:
        """Deltas of one request's statistics over one engine step; per_pos[i]: newly accepted at position i."""
        if drafts:
            self.c["num_drafts"].inc(drafts)
            self.c["num_draft_tokens"].inc(draft_tokens)
        if accepted:
            self.c["num_accepted_tokens"].inc(accepted)
        for pos, n in enumerate(per_pos):
            if n:
                self.accepted_per_pos.labels(**self.labels, position=str(pos)).inc(n)
        if steps:
            self.window.add(steps, drafts, draft_tokens, accepted)

    def record_draft_lengths(self, counts: Sequence[int]) -> None:
        """counts[k]: this request's new steps whose policy allowed k draft tokens."""
        for length, n in enumerate(counts):
            if n:
                self.chosen_draft_length.labels(**self.labels, length=str(length)).inc(n)

    def record_tokens(self, n: int) -> None:
        if n:
            self.c["generation_tokens"].inc(n)

    def window_acceptance_rate(self) -> float:
        _, _, drafted, accepted = self.window.totals()
        return accepted / drafted if drafted else math.nan

    def window_efficiency(self) -> float:
        _, drafts, _, accepted = self.window.totals()
        return (accepted + drafts) / (drafts * (self.k + 1)) if drafts else math.nan

    def window_mean_acceptance_length(self) -> float:
        steps, _, _, accepted = self.window.totals()
        return (accepted + steps) / steps if steps else math.nan

    def render(self) -> bytes:
        return generate_latest(self.registry)
