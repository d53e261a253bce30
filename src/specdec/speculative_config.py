"""`speculative_config`: vLLM's keys, validated against the chosen method's own options.

A method declares its options as a dataclass (see drafting/); this module only reads the method name and
the draft-length schedule (common to every method), checks the other keys against that dataclass and
reports every problem with the valid choices.

Draft length per step, across a batch:
- `"num_speculative_tokens": k` (default: the method's): k every step, whatever the batch size.
- `"num_speculative_tokens": "auto"`: each step, each sequence gets the draft length, zero included, that
  maximises the batch's expected accepted tokens per second, from the target's measured cost curve and
  the sequence's own acceptance per draft position (scheduling/draft_length.py). `max_num_speculative_tokens`
  caps it (default: the method's `auto_max_speculative_tokens` where it sets one, n-gram's 15, else its
  default length).
- `"num_speculative_tokens_by_batch_size": [[first, last, k], ...]`: k while the number of running
  sequences is in [first, last] (vLLM's per-batch-size speculation length); outside every range, the
  method's num_speculative_tokens.

A learned drafter's config.json may store its measured best settings (speculators' `proposal_methods`):
every key the user leaves out is taken from there before the method's own defaults (see
drafting/proposal_settings.py for which stored entry applies). With "auto", a stored draft length is the cap.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdec.drafting.proposal_settings import drafter_defaults, stored_entry, stored_schedule
from specdec.drafting.registry import available_methods, get_method

if TYPE_CHECKING:
    import torch


AUTO = "auto"


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    options: Any  # the method's Options dataclass instance
    auto: bool = False  # "num_speculative_tokens": "auto"
    by_batch_size: tuple[tuple[int, int, int], ...] = ()  # (first, last, k) ranges of running sequences
    # keys taken from the drafter's stored best settings, not from the user (drafting/proposal_settings.py)
    from_drafter: tuple[str, ...] = field(default=(), compare=False)

    @property
    def num_speculative_tokens(self) -> int:
        return int(getattr(self.options, "num_speculative_tokens", 0))

    def to_dict(self) -> dict[str, Any]:
        out = {"method": self.method, **dataclasses.asdict(self.options)}
        if self.auto:
            out["max_num_speculative_tokens"] = out.get("num_speculative_tokens")
            out["num_speculative_tokens"] = AUTO
        if self.by_batch_size:
            out["num_speculative_tokens_by_batch_size"] = [list(r) for r in self.by_batch_size]
        return out

    @classmethod
    def from_value(cls, value: Any, quantization: str | None = None,
                   device: str | torch.device | None = None) -> SpeculativeConfig | None:
        """What `LLM(speculative_config=...)` takes: None (plain decoding), a SpeculativeConfig, a dict, or the
        same JSON text as the CLI's --speculative-config. `quantization` and `device`: the target's (None: cuda
        where available); a drafter's stored default may depend on them (proposal_settings.default_for_kernels)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            return cls.from_json(value, quantization=quantization, device=device)
        if isinstance(value, Mapping):
            return cls.from_dict(dict(value), quantization, device)
        raise ValueError("speculative_config must be a dict, a JSON string or a SpeculativeConfig, "
                         f"got {type(value).__name__}")

    @classmethod
    def from_json(cls, text: str, source: str = "speculative_config", quantization: str | None = None,
                  device: str | torch.device | None = None) -> SpeculativeConfig:
        """`source` names the text in errors (the CLI passes its flag)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} is not valid JSON: {exc}") from exc
        return cls.from_dict(data, quantization, device)

    @classmethod
    def from_dict(cls, data: dict[str, Any], quantization: str | None = None,
                  device: str | torch.device | None = None) -> SpeculativeConfig:
        """`quantization` and `device`: the target's (None: cuda where available); a drafter's stored default
        for a bare config may depend on them."""
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
        # the drafter's config, read once
        entry, source = stored_entry(method, proposer.Options, data, quantization, device)
        data = {**stored_schedule(entry, data), **data}  # a drafter that stores "auto"
        auto, by_batch_size = _schedule(data, proposer.Options)
        stored = drafter_defaults(method, proposer.Options, data, entry, source)
        try:
            options = parse_options(proposer.Options, {**data, **stored}, method)
        except ValueError as exc:
            if not stored:
                raise
            parse_options(proposer.Options, data, method)  # the user's own mistakes are reported as such
            raise ValueError(f"{exc} (with the settings stored in {source}: {stored})") from exc
        return cls(method=method, options=options, auto=auto, by_batch_size=by_batch_size,
                   from_drafter=tuple(sorted(stored)))


def _schedule(data: dict[str, Any], options_class: type) -> tuple[bool, tuple[tuple[int, int, int], ...]]:
    """Pops the draft-length schedule keys off `data` (in place); the rest are the method's."""
    auto = data.get("num_speculative_tokens") == AUTO
    if auto:
        data.pop("num_speculative_tokens")
        cap = data.pop("max_num_speculative_tokens", None)
        if cap is None:  # the method's own cap for "auto", where it has one; else its default length
            cap = getattr(options_class, "auto_max_speculative_tokens", None)
        if cap is not None:
            if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
                raise ValueError(f"invalid speculative_config: max_num_speculative_tokens must be an int >= 1, got {cap!r}")
            data["num_speculative_tokens"] = cap
    elif "max_num_speculative_tokens" in data:
        raise ValueError('invalid speculative_config: max_num_speculative_tokens goes with "num_speculative_tokens": "auto"')
    ranges = data.pop("num_speculative_tokens_by_batch_size", None)
    if ranges is None:
        return auto, ()
    if auto:
        raise ValueError('invalid speculative_config: "num_speculative_tokens": "auto" and '
                         "num_speculative_tokens_by_batch_size exclude each other")
    shape = "a list of [first_batch_size, last_batch_size, num_speculative_tokens] with 1 <= first <= last, k >= 0"
    if not isinstance(ranges, list) or not ranges:
        raise ValueError(f"invalid speculative_config: num_speculative_tokens_by_batch_size must be {shape}")
    out = []
    for r in ranges:
        ok = (isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
              and 1 <= r[0] <= r[1] and r[2] >= 0)
        if not ok:
            raise ValueError(f"invalid speculative_config: num_speculative_tokens_by_batch_size must be {shape}, "
                             f"got {r!r}")
        out.append((r[0], r[1], r[2]))
    out.sort()
    for (a0, a1, _), (b0, _, _) in zip(out, out[1:]):
        if b0 <= a1:
            raise ValueError(f"invalid speculative_config: batch-size ranges overlap at {b0}")
    return auto, tuple(out)


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
