"""Incremental detokenization: the text of a growing list of token ids, decoding only a short tail.

Decoding all output ids again on every step costs O(n) per step, O(n^2) per request. Here each new token
decodes a window that starts at the last point where text was emitted: the text of window + new tokens, minus
the text of the window alone, is what the new tokens add. Starting both decodes at the same token makes
tokenizer quirks that depend on position (SentencePiece drops the first token's leading space) cancel out.
Text that ends in U+FFFD (a character split over byte tokens) is held back until the character is complete.

The algorithm works with any tokenizer's `decode` (fast or slow), which is why it is written here instead of
using `tokenizers.decoders.DecodeStream`, which needs a Rust tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # complete characters so far (append-only)
        self.prefix_offset = 0  # where the decode window starts
        self.read_offset = 0  # ids before this are already in `text`

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, ids: Sequence[int]) -> str:
        """Appends tokens; returns the text they complete ("" while a character is still incomplete)."""
        self.ids.extend(ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end), for the request's last step."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self.read_offset == len(self.ids):
            return ""
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or (not final and after.endswith(INCOMPLETE)):
            return ""
        new = after[len(before) :]
        self.text += new
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new
