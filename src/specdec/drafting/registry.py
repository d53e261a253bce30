"""Method name -> Proposer class. A drafting method is one module that registers itself here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdec.drafting.base import Proposer

_METHODS: dict[str, type[Proposer]] = {}


def register(name: str) -> Callable[[type[Proposer]], type[Proposer]]:
    def add(cls: type[Proposer]) -> type[Proposer]:
        if name in _METHODS:
            raise ValueError(f"drafting method {name!r} registered twice")
        _METHODS[name] = cls
        cls.method_name = name
        return cls

    return add


def available_methods() -> list[str]:
    _load_builtin_methods()
    return sorted(_METHODS)


def get_method(name: str) -> type[Proposer]:
    _load_builtin_methods()
    if name not in _METHODS:
        raise ValueError(f"unknown speculative method {name!r}; available: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def _load_builtin_methods() -> None:
    # Importing a method's module registers it.
    from specdec.drafting import dflash, draft_model, eagle3, hybrid, medusa, mtp, ngram  # noqa: F401
