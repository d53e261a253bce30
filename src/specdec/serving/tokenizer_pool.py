"""Tokenizing and chat-templating off the event loop.

A 4 MiB body takes a tokenizer hundreds of milliseconds; on the event loop that would stall every stream and
/health. Here the work runs on worker threads, at most `size` at once (the rest wait their turn), each with
its own copy of the tokenizer: a Rust tokenizer shared between threads can fail with "Already borrowed".

`max_prompt_chars` is the cheap bound checked before any tokenizing: no token covers more than the longest
token in the vocabulary, so a text longer than max_prompt_tokens x that length can only be refused.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

T = TypeVar("T")
NORMALIZER_SLACK = 2  # normalizers (NFKC, ...) may fold several characters into one before tokenizing


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token can stand for (its vocabulary string; byte-level and SentencePiece
    spellings have at least as many characters as the text they decode to)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return max((len(t) for t in vocab), default=1) or 1


def max_prompt_chars(tokenizer: Any, max_prompt_tokens: int) -> int:
    return max_prompt_tokens * longest_token_chars(tokenizer) * NORMALIZER_SLACK


class TokenizerPool:
    def __init__(self, tokenizer: Any, size: int = 2) -> None:
        if size < 1:
            raise ValueError(f"the tokenizer pool needs at least one worker, got {size}")
        self.size = size
        self._tokenizer = tokenizer
        self._free: asyncio.Queue[Any] | None = None  # made on first use, inside the server's event loop

    async def run(self, work: Callable[[Any], T]) -> T:
        """`work(tokenizer)` on a worker thread, with a tokenizer copy no other thread is using."""
        if self._free is None:
            self._free = asyncio.Queue()
            for _ in range(self.size):
                self._free.put_nowait(copy.deepcopy(self._tokenizer))
        tokenizer = await self._free.get()
        try:
            return await anyio.to_thread.run_sync(work, tokenizer)
        finally:
            self._free.put_nowait(tokenizer)
