"""Chat messages -> prompt token ids.

A tokenizer with a chat template renders the messages itself (`apply_chat_template(...,
add_generation_prompt=True)`; the special tokens come from the template, none are added on top).

A base model has no template (the default Gemma 3 270M GGUF is one); it gets the *plain template*: one line
per message, "System: ", "User: " or "Assistant: " then the content, and a final "Assistant:" for the model
to continue, tokenized with the tokenizer's usual special tokens (BOS):

    System: You are terse.
    User: What is 2+2?
    Assistant:

("developer" messages are rendered as System.) A base model happily writes the next "User:" turn itself,
so the plain template adds the stop string "\\nUser:" to the request's own stop strings: the turn ends
there, as a chat template's end-of-turn token ends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdec.serving.errors import bad_request

PLAIN_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
PLAIN_STOP = ["\nUser:"]


@dataclass
class RenderedChat:
    prompt: str
    token_ids: list[int]
    template: str  # "tokenizer" or "plain"
    stop: list[str] = field(default_factory=list)  # stop strings the template adds


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_plain(messages: list[dict[str, str]]) -> str:
    lines = [f"{PLAIN_ROLES[m['role']]}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> RenderedChat:
    if not has_chat_template(tokenizer):
        text = render_plain(messages)
        return RenderedChat(text, _tokenize(tokenizer, text), "plain", list(PLAIN_STOP))
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # jinja's raise_exception (e.g. roles must alternate) and template errors
        raise bad_request(f"the model's chat template rejected the messages: {exc}", param="messages") from None
    return RenderedChat(text, _tokenize(tokenizer, text, add_special_tokens=False), "tokenizer")


def _tokenize(tokenizer: Any, text: str, **kwargs: Any) -> list[int]:
    try:
        return list(tokenizer(text, **kwargs).input_ids)
    except Exception as exc:  # noqa: BLE001 - e.g. lone UTF-16 surrogates in a message
        raise bad_request(f"the messages cannot be tokenized ({type(exc).__name__}: {exc}); are they valid "
                          "Unicode (no lone surrogates)?", param="messages") from None
