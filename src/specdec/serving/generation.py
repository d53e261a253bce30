"""One request's handle, shared by its HTTP handler (the event loop) and the worker thread.

The worker posts a StepEvent per engine step into the handle's mailbox; the handler takes everything posted
so far at once. Events carry only the text added since the previous one, and the mailbox holds at most
MAX_PENDING_EVENTS (beyond that the newest two are merged), so a client that reads slowly costs memory in
proportion to its output, not to its square. `unread_for` tells the worker how long posted events have waited:
a client that stopped reading altogether is cancelled after the server's stall timeout.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from specdec.engine.stats import SpecDecodingStats
from specdec.sampling_params import SamplingParams

MAX_PENDING_EVENTS = 64


@dataclass
class StepEvent:
    delta: str  # output text added since the previous event (stop strings cut, EOS left out)
    num_output_tokens: int
    finish_reason: str | None = None  # "stop", "length", or "abort" (cancelled)
    stop_reason: int | str | None = None
    stats: SpecDecodingStats | None = None  # the request's statistics, on the last event
    error: BaseException | None = None
    text: str | None = None  # the whole output text, on the last event only

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def then(self, later: StepEvent) -> StepEvent:
        """One event standing for this one followed by `later`."""
        return StepEvent(self.delta + later.delta, later.num_output_tokens, later.finish_reason, later.stop_reason,
                         later.stats, later.error, later.text)


class Generation:
    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, arrival: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.arrival = arrival  # time.monotonic() when the HTTP request arrived
        self.loop = loop
        self.cancelled = threading.Event()
        self.done = False  # set by the worker with the last event
        self.released = False  # the handler is finished with it (it no longer counts against the 429 limit)
        self._lock = threading.Lock()
        self._pending: list[StepEvent] = []
        self._unread_since: float | None = None
        self._wakeup = asyncio.Event()

    # ---- the worker thread ----

    def post(self, event: StepEvent) -> None:
        with self._lock:
            if event.final:
                self.done = True
            first = not self._pending
            if len(self._pending) >= MAX_PENDING_EVENTS:
                self._pending[-1] = self._pending[-1].then(event)
            else:
                self._pending.append(event)
            if first:
                self._unread_since = time.monotonic()
        if first:
            try:
                self.loop.call_soon_threadsafe(self._wakeup.set)
            except RuntimeError:  # the event loop is closed: the server is shutting down
                pass

    def unread_for(self, now: float) -> float:
        """Seconds the oldest event not yet taken by the handler has waited (0 when none waits)."""
        with self._lock:
            return 0.0 if self._unread_since is None else now - self._unread_since

    # ---- the event loop ----

    async def take(self, timeout: float) -> list[StepEvent]:
        """Every event posted since the last take, in order; [] if none came within `timeout` seconds."""
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except asyncio.TimeoutError:
            return []
        with self._lock:
            events, self._pending, self._unread_since = self._pending, [], None
            self._wakeup.clear()  # a post after this schedules a new set(), which runs after we return
        return events
