"""Type checks for numbers and token ids passed in by callers.

A wrong type must be a ValueError that names the parameter, not a TypeError from deep inside the engine,
and a float must never be truncated into an int (a prompt `[1.7, 2.0]` is a mistake, not tokens 1 and 2).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterable, Mapping
from typing import Any


def as_int(value: Any) -> int | None:
    """`value` as an int when it is one (a Python or numpy int, a one-element torch integer tensor), else None.
    Bools and floats (2.0 too) are not ints here."""
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) == "torch.bool":  # torch bools have __index__
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_real(value: Any) -> float | None:
    """`value` as a float when it is a real number (int, float, numpy scalar), else None; bools are not numbers
    here. NaN and inf pass: the caller's range check names them."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def token_ids(value: Any, name: str, vocab_size: int | None = None) -> list[int]:
    """`value` as a list of token ids: ints (see as_int) in [0, vocab_size), or a ValueError naming `name`."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of ints, got {value!r}")
    items = list(value)
    ids = [as_int(t) for t in items]
    bad = [t for t, i in zip(items, ids) if i is None or i < 0 or (vocab_size is not None and i >= vocab_size)]
    if bad:
        where = ">= 0" if vocab_size is None else f"in [0, {vocab_size})"
        raise ValueError(f"{name} must be ints {where}, got {bad[:5]!r}")
    return ids  # type: ignore[return-value]  # no None left: every None was in `bad`
