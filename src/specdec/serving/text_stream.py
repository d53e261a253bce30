"""Incremental text for streaming: what can be sent now without ever having to take it back.

The engine's text is re-decoded from all output tokens every step, and it is not append-only: a character
split over byte tokens decodes as U+FFFD until its last byte arrives. And a stop string may begin in text
already produced ("\\nUs" before "\\nUser:" is complete) and must then not reach the client. So while the
request runs, trailing U+FFFD characters and the last (longest stop string - 1) characters are held back;
on the last step everything left is sent. The concatenated deltas equal the final text.
"""

from __future__ import annotations

from collections.abc import Sequence


class TextDeltas:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.sent = ""

    def update(self, text: str, finished: bool) -> str:
        """Returns the text to send now, given the full text so far."""
        if finished:
            ready = text
        else:
            ready = text[: len(text) - self.holdback] if self.holdback else text
            ready = ready.rstrip("\ufffd")
        if not ready.startswith(self.sent) or len(ready) <= len(self.sent):
            return ""  # nothing new (or earlier text changed, which the hold-back above prevents)
        delta = ready[len(self.sent) :]
        self.sent = ready
        return delta
