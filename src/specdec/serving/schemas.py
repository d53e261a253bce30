"""OpenAI request bodies (pydantic, strict and closed) and their translation into SamplingParams.

Types are checked by pydantic in strict mode (no "5" for 5, no true for 1) and unknown fields are rejected
with the list of supported ones. Fields OpenAI defines that we do not implement are accepted only at their
no-op value (e.g. `n: 1`, `presence_penalty: 0`, `logprobs: null`); anything else is a 400 that names the
field. Nothing is silently replaced by a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specdec.sampling_params import MIN_TEMPERATURE, SamplingParams
from specdec.serving.errors import APIError, bad_request

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
SEED_RANGE = (0, 2**63 - 1)


@dataclass(frozen=True)
class Limits:
    max_model_len: int  # prompt + max_tokens
    max_prompt_tokens: int
    max_tokens_limit: int  # the largest max_tokens a request may ask for
    vocab_size: int
    max_prompt_chars: int | None = None  # longer prompt texts are refused before tokenizing (tokenizer_pool.py)
    prompt_limit_source: str = "--max-prompt-tokens / --max-model-len"  # what sets max_prompt_tokens, for errors


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None


class _CommonRequest(_Strict):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM extension
    n: int | None = None
    stop: Any = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    user: str | None = None  # end-user id: metadata, accepted and not used
    ignore_eos: bool | None = None  # vLLM extension
    stop_token_ids: list[int] | None = None  # vLLM extension

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _unsupported(self) -> list[tuple[str, str]]:
        """(param, message) for every field set to a value we do not implement."""
        problems = []
        if self.n not in (None, 1):
            problems.append(("n", f"n must be 1 (one choice per request), got {self.n}"))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0):
                problems.append((name, f"{name} is not supported (only 0), got {value}"))
        if self.logit_bias:
            problems.append(("logit_bias", "logit_bias is not supported (only null or {})"))
        if self.stream_options is not None and not self.stream:
            problems.append(("stream_options", "stream_options is only allowed when stream is true"))
        return problems

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling_params(
        self, limits: Limits, prompt_len: int, default_max_tokens: int | None, extra_stop: list[str] = ()
    ) -> SamplingParams:
        """Checks every value and the lengths; raises a 400 naming the first bad field."""
        problems = self._unsupported()
        if problems:
            param, message = problems[0]
            raise bad_request(message, param=param, code="unsupported_parameter")
        temperature = 1.0 if self.temperature is None else float(self.temperature)
        if not 0 <= temperature <= 2:
            raise bad_request(f"temperature must be in [0, 2], got {temperature}", param="temperature")
        if 0 < temperature < MIN_TEMPERATURE:  # logits / 1e-300 overflow to inf, and softmax gives NaN
            raise bad_request(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {temperature}",
                              param="temperature")
        top_p = 1.0 if self.top_p is None else float(self.top_p)
        if not 0 < top_p <= 1:
            raise bad_request(f"top_p must be in (0, 1], got {top_p}", param="top_p")
        top_k = 0 if self.top_k is None else self.top_k
        if top_k < -1:
            raise bad_request(f"top_k must be -1 or 0 (off) or a positive int, got {top_k}", param="top_k")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise bad_request(f"seed must be in [0, 2**63 - 1], got {self.seed}", param="seed")
        stop = _stop_strings(self.stop)
        stop_ids = list(self.stop_token_ids or [])
        bad_ids = [t for t in stop_ids if not 0 <= t < limits.vocab_size]
        if bad_ids:
            raise bad_request(f"stop_token_ids must be in [0, {limits.vocab_size}), got {bad_ids}", param="stop_token_ids")
        if prompt_len > limits.max_prompt_tokens:
            raise bad_request(
                f"the prompt has {prompt_len} tokens, more than this server's limit of {limits.max_prompt_tokens} "
                f"(set by {limits.prompt_limit_source})",
                param="messages" if isinstance(self, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        max_tokens = self.requested_max_tokens()
        param = self._max_tokens_param()
        if max_tokens is None:
            if default_max_tokens is None:  # chat: as many as fit, up to the server's limit
                default_max_tokens = min(limits.max_tokens_limit, limits.max_model_len - prompt_len)
            max_tokens = default_max_tokens
        elif max_tokens < 1:
            raise bad_request(f"{param} must be >= 1, got {max_tokens}", param=param)
        elif max_tokens > limits.max_tokens_limit:
            raise bad_request(
                f"{param} must be <= {limits.max_tokens_limit} (this server's limit), got {max_tokens}", param=param
            )
        if prompt_len + max_tokens > limits.max_model_len:
            raise bad_request(
                f"the prompt ({prompt_len} tokens) plus {param} ({max_tokens}) exceeds the maximum context length "
                f"of {limits.max_model_len} tokens",
                param=param,
                code="context_length_exceeded",
            )
        return SamplingParams(
            temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=self.seed,
            stop=[*stop, *[s for s in extra_stop if s not in stop]], stop_token_ids=stop_ids,
            ignore_eos=bool(self.ignore_eos),
        )

    def _max_tokens_param(self) -> str:
        return "max_tokens"


class CompletionRequest(_CommonRequest):
    prompt: Any
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None

    def _unsupported(self) -> list[tuple[str, str]]:
        problems = super()._unsupported()
        if self.echo:
            problems.append(("echo", "echo is not supported (only false)"))
        if self.suffix:
            problems.append(("suffix", "suffix is not supported (only null)"))
        if self.best_of not in (None, 1):
            problems.append(("best_of", f"best_of must be 1, got {self.best_of}"))
        if self.logprobs is not None:
            problems.append(("logprobs", "logprobs are not supported (only null)"))
        return problems

    def prompt_input(self) -> str | list[int]:
        """The one prompt: a string or a list of token ids (a one-element batch of either is unwrapped)."""
        p = self.prompt
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]
        if isinstance(p, str):
            return p
        if isinstance(p, list) and p and all(type(t) is int for t in p):
            return p
        if isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
            raise bad_request(f"batched prompts are not supported: send one prompt per request, got {len(p)}",
                              param="prompt", code="unsupported_parameter")
        if p is None:
            raise bad_request("prompt is required", param="prompt")
        if isinstance(p, list) and not p:
            raise bad_request("prompt must not be an empty list", param="prompt")
        raise bad_request(
            "prompt must be a string, a list of token ids, or a one-element list of either; got "
            f"{type(p).__name__}", param="prompt",
        )


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Any = None
    name: str | None = None

    def text(self, index: int) -> str:
        where = f"messages[{index}].content"
        c = self.content
        if isinstance(c, str):
            return c
        if c is None:
            if self.role == "assistant":
                return ""
            raise bad_request(f"{where} is required for role {self.role!r}", param=where)
        if isinstance(c, list):
            parts = []
            for j, part in enumerate(c):
                if not isinstance(part, dict) or "type" not in part:
                    raise bad_request(f"{where}[{j}] must be an object with a 'type'", param=where)
                if part["type"] != "text":
                    raise bad_request(f"{where}[{j}]: content part type {part['type']!r} is not supported (only "
                                      "'text')", param=where, code="unsupported_parameter")
                extra = set(part) - {"type", "text"}
                if not isinstance(part.get("text"), str) or extra:
                    raise bad_request(f"{where}[{j}] must be {{'type': 'text', 'text': <string>}}", param=where)
                parts.append(part["text"])
            return "".join(parts)
        raise bad_request(f"{where} must be a string or a list of text parts, got {type(c).__name__}", param=where)


class ChatCompletionRequest(_CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    def _unsupported(self) -> list[tuple[str, str]]:
        problems = super()._unsupported()
        if self.logprobs:
            problems.append(("logprobs", "logprobs are not supported (only false)"))
        if self.top_logprobs is not None:
            problems.append(("top_logprobs", "top_logprobs is not supported (only null)"))
        if self.tools:
            problems.append(("tools", "tools are not supported"))
        if self.tool_choice not in (None, "none"):
            problems.append(("tool_choice", "tool_choice is not supported (only 'none')"))
        if self.response_format not in (None, {"type": "text"}):
            problems.append(("response_format", "response_format is not supported (only {'type': 'text'})"))
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):
            problems.append(("max_completion_tokens", "max_tokens and max_completion_tokens disagree; send one"))
        return problems

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def _max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def message_texts(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text(i)} for i, m in enumerate(self.messages)]


def _stop_strings(stop: Any) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list):
        raise bad_request(f"stop must be a string or a list of strings, got {type(stop).__name__}", param="stop")
    odd = [type(s).__name__ for s in items if not isinstance(s, str)]
    if odd:
        raise bad_request(f"stop must be a string or a list of strings, got a list holding {odd[0]}", param="stop")
    if len(items) > MAX_STOP_STRINGS:
        raise bad_request(f"at most {MAX_STOP_STRINGS} stop strings, got {len(items)}", param="stop")
    if any(not s for s in items):
        raise bad_request("stop strings must not be empty", param="stop")
    if any(len(s) > MAX_STOP_LENGTH for s in items):
        raise bad_request(f"stop strings must be at most {MAX_STOP_LENGTH} characters", param="stop")
    return list(items)


def parse_request(cls: type[_CommonRequest], body: Any) -> _CommonRequest:
    """Validates a decoded JSON body; every problem becomes one 400 that names the fields."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        return cls.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(cls, exc) from None


def _validation_error(cls: type[BaseModel], exc: ValidationError) -> APIError:
    messages, first_param = [], None
    for err in exc.errors(include_url=False):
        loc = _loc(err["loc"])
        first_param = first_param or loc
        if err["type"] == "extra_forbidden":
            owner = cls if len(err["loc"]) == 1 else None
            supported = f" (supported: {', '.join(owner.model_fields)})" if owner else ""
            messages.append(f"unknown field {loc!r}{supported}")
        elif err["type"] == "missing":
            messages.append(f"{loc} is required")
        else:
            messages.append(f"{loc}: {err['msg']} (got {_short(err.get('input'))})")
    unsupported = any(e["type"] == "extra_forbidden" for e in exc.errors())
    return bad_request("; ".join(messages), param=first_param, code="unsupported_parameter" if unsupported else None)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
