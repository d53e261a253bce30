"""OpenAI response and stream-chunk bodies, each with the request's speculative figures.

Every completion (and the last chunk of a stream, and the usage chunk) carries `spec_decoding`:

    method, num_speculative_tokens   the server's speculative config (null / 0: plain decoding)
    num_steps                        target forwards after the prompt
    num_drafts                       steps that had a non-empty draft
    num_draft_tokens                 drafted tokens   (llama.cpp's draft_n, repeated under that name)
    num_accepted_tokens              accepted tokens  (llama.cpp's draft_n_accepted, likewise)
    accepted_per_position            accepted tokens at draft position 0, 1, ...
    acceptance_rate                  accepted / drafted
    mean_acceptance_length           tokens per target forward, (accepted + steps) / steps

Summed over responses, these equal the /metrics counters of the same name.
"""

from __future__ import annotations

import time
from typing import Any

from specdec.engine.stats import SpecDecodingStats


def spec_figures(stats: SpecDecodingStats | None, method: str | None, k: int) -> dict[str, Any]:
    s = stats or SpecDecodingStats()
    return {
        "method": method,
        "num_speculative_tokens": k,
        "num_steps": s.num_steps,
        "num_drafts": s.num_drafts,
        "num_draft_tokens": s.num_draft_tokens,
        "num_accepted_tokens": s.num_accepted_tokens,
        "accepted_per_position": list(s.accepted_per_position),
        "acceptance_rate": round(s.acceptance_rate, 6),
        "mean_acceptance_length": round(s.mean_acceptance_length, 6),
        "draft_n": s.num_draft_tokens,
        "draft_n_accepted": s.num_accepted_tokens,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ResponseBuilder:
    """Builds the bodies of one request (completion or chat) with a fixed id and creation time."""

    def __init__(self, kind: str, request_id: str, model: str) -> None:
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + request_id
        self.model = model
        self.created = int(time.time())

    def _head(self, object_: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_, "created": self.created, "model": self.model}

    def full(self, text: str, finish_reason: str | None, stop_reason: Any, usage_: dict, spec: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason, "stop_reason": stop_reason}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": stop_reason}
            body = self._head("text_completion")
        return {**body, "choices": [choice], "usage": usage_, "spec_decoding": spec}

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False,
              include_usage: bool = False, spec: dict | None = None) -> dict:
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            body = self._head("text_completion")
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None
        if spec is not None:
            body["spec_decoding"] = spec
        return body

    def usage_chunk(self, usage_: dict, spec: dict) -> dict:
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**body, "choices": [], "usage": usage_, "spec_decoding": spec}
