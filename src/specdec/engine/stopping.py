"""When a request ends: EOS, stop token ids, stop strings, or max_tokens, even in the middle of a draft."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.sampling_params import SamplingParams


@dataclass
class Finish:
    reason: str  # "stop" or "length"
    stop_reason: int | str | None = None  # the stop token id or stop string, vLLM's stop_reason


class StopChecker:
    """Accepts tokens one by one and says where the output ends.

    EOS and stop token ids are kept in token_ids (as vLLM does) and left out of the text; a stop string
    ends the text just before it, and token_ids end with the token that completed it.
    """

    def __init__(self, tokenizer: Any, params: SamplingParams, eos_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.output: list[int] = []
        self.finish: Finish | None = None
        self.stop_text_end: int | None = None  # char offset where a stop string begins

    def extend(self, tokens: Sequence[int]) -> list[int]:
        """Appends tokens until the request finishes; returns the ones that belong to the output."""
        taken = []
        for token in tokens:
            if self.finish is not None:
                break
            self.output.append(token)
            taken.append(token)
            if token in self.stop_ids:
                self.finish = Finish("stop", token)
            elif self.params.stop and self._hit_stop_string():
                pass
            elif len(self.output) >= self.params.max_tokens:
                self.finish = Finish("length")
        return taken

    def _hit_stop_string(self) -> bool:
        # The whole text is searched, not only its new tail: decoding is not append-only (a character split
        # over byte tokens decodes as U+FFFD until its last byte arrives, and then replaces it).
        text = self.tokenizer.decode(self.output, skip_special_tokens=True)
        best = None
        for s in self.params.stop:
            i = text.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return False
        self.stop_text_end = best[0]
        self.finish = Finish("stop", best[1])
        return True

    def text(self) -> str:
        ids = self.output
        if self.finish is not None and isinstance(self.finish.stop_reason, int):
            ids = ids[:-1]  # an EOS or stop token id stays out of the text even when it is not a special token
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text if self.stop_text_end is None else text[: self.stop_text_end]
