"""When a request ends: EOS, stop token ids, stop strings, or max_tokens, even in the middle of a draft."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.engine.detokenizer import IncrementalDetokenizer
from specdec.sampling_params import SamplingParams


@dataclass
class Finish:
    reason: str  # "stop" or "length"
    stop_reason: int | str | None = None  # the stop token id or stop string, vLLM's stop_reason


class StopChecker:
    """Accepts tokens one by one and says where the output ends.

    EOS and stop token ids are kept in token_ids (as vLLM does) and left out of the text; a stop string
    ends the text just before it, and token_ids end with the token that completed it. The text is built
    incrementally (engine/detokenizer.py): token by token when stop strings must be checked, else only when
    the text is asked for. Each stop-string search reads only the new text plus the longest stop string's
    length before it, so a request's text and stop checks cost O(n) in all.
    """

    def __init__(self, tokenizer: Any, params: SamplingParams, eos_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.output: list[int] = []
        self.finish: Finish | None = None
        self.stop_text_end: int | None = None  # char offset where a stop string begins
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self._fed = 0  # output tokens the detokenizer has read
        self.longest_stop = max((len(s) for s in params.stop), default=0)

    def extend(self, tokens: Sequence[int]) -> list[int]:
        """Appends tokens until the request finishes; returns the ones that belong to the output."""
        taken = []
        for token in tokens:
            if self.finish is not None:
                break
            self.output.append(token)
            taken.append(token)
            if token in self.stop_ids:
                self.finish = Finish("stop", token)  # the token stays out of the text
                break
            if self.params.stop:  # stop strings need the text token by token; without them it is built when asked
                searched = len(self.detokenizer.text)
                if self._catch_up() and self._hit_stop_string(searched):
                    break
            if len(self.output) >= self.params.max_tokens:
                self.finish = Finish("length")
        return taken

    def _catch_up(self) -> str:
        """Feeds the detokenizer the output tokens it has not read (never a final stop token id) and, once the
        request has finished, what it still holds back; returns the text added."""
        end = len(self.output)
        if self.finish is not None and isinstance(self.finish.stop_reason, int):
            end -= 1
        new = self.detokenizer.add(self.output[self._fed : end]) if end > self._fed else ""
        self._fed = max(self._fed, end)
        if self.finish is not None and self.stop_text_end is None:
            new += self.detokenizer.flush()  # an incomplete last character decodes as U+FFFD, as in decode()
        return new

    def _hit_stop_string(self, searched: int) -> bool:
        # No stop string occurs in the first `searched` characters (checked before), so a new one ends in the
        # new text and starts at most longest_stop - 1 characters before it.
        text = self.detokenizer.text
        start = max(0, searched - self.longest_stop + 1)
        best = None
        for s in self.params.stop:
            i = text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return False
        self.stop_text_end = best[0]
        self.finish = Finish("stop", best[1])
        return True

    def stream_text(self) -> tuple[str, int]:
        """The text built so far and where the output ends in it (before a stop string once one is found)."""
        self._catch_up()
        text = self.detokenizer.text
        return text, len(text) if self.stop_text_end is None else self.stop_text_end

    def text(self) -> str:
        text, end = self.stream_text()
        return text[:end]
