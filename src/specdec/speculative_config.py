"""`speculative_config`: vLLM's keys, validated against the chosen method's own options.

A method declares its options as a dataclass (see drafting/); this module only reads the method name,
checks the other keys against that dataclass and reports every problem with the valid choices.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from specdec.drafting.registry import available_methods, get_method


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    options: Any  # the method's Options dataclass instance

    @property
    def num_speculative_tokens(self) -> int:
        return int(getattr(self.options, "num_speculative_tokens", 0))

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, **dataclasses.asdict(self.options)}

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeculativeConfig:
        if not isinstance(data, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        method = data.pop("method", None)
        if method is None:
            # vLLM infers the method from the model: "ngram" names the method, anything else is a draft model.
            model = data.get("model")
            if model is None:
                raise ValueError(f"speculative_config needs 'method' (one of: {', '.join(available_methods())})")
            method = "ngram" if model == "ngram" else "draft_model"
            if method == "ngram":
                data.pop("model")
        proposer = get_method(method)
        return cls(method=method, options=parse_options(proposer.Options, data, method))


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, annotation)


def parse_options(options_cls: type, data: dict[str, Any], method: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    hints = typing.get_type_hints(options_cls)
    valid = ", ".join(["method", *fields])
    problems = []
    for key, value in data.items():
        if key not in fields:
            problems.append(f"unknown key {key!r} for method {method!r} (valid keys: {valid})")
        elif not _type_ok(value, hints[key]):
            problems.append(f"{key} must be {_type_name(hints[key])}, got {value!r}")
    missing = [n for n, f in fields.items() if _required(f) and n not in data]
    problems += [f"method {method!r} needs {n!r}" for n in missing]
    if problems:
        raise ValueError("invalid speculative_config: " + "; ".join(problems))
    options = options_cls(**data)
    problems = options.problems() if hasattr(options, "problems") else []
    if problems:
        raise ValueError("invalid speculative_config: " + "; ".join(problems))
    return options


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", str(annotation)).replace("NoneType", "null")
