"""Incremental text for streaming: what can be sent now without ever having to take it back.

The engine's text grows append-only (engine/detokenizer.py holds back a character split over byte tokens
until it is complete), but a stop string may begin in text already produced ("\\nUs" before "\\nUser:" is
complete) and must then not reach the client. So while the request runs, the last (longest stop string - 1)
characters are held back; on the last step everything up to the stop string is sent. Each update slices only
the new text, and the concatenated deltas equal the final text.
"""

from __future__ import annotations

from collections.abc import Sequence


class TextDeltas:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.sent = 0  # characters of the text already sent

    def update(self, text: str, end: int, finished: bool) -> str:
        """The text to send now, given the engine's text and where the output ends in it (`end` is before a
        stop string once one is found, else len(text))."""
        ready = end if finished else min(end, len(text) - self.holdback)
        if ready <= self.sent:
            return ""
        delta = text[self.sent : ready]
        self.sent = ready
        return delta
