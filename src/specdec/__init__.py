"""specdec: lossless speculative decoding for LLMs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "SpeculativeConfig"]

if TYPE_CHECKING:
    from specdec.api import LLM, CompletionOutput, RequestOutput
    from specdec.sampling_params import SamplingParams
    from specdec.speculative_config import SpeculativeConfig

_HOMES = {
    "LLM": "specdec.api",
    "CompletionOutput": "specdec.api",
    "RequestOutput": "specdec.api",
    "SamplingParams": "specdec.sampling_params",
    "SpeculativeConfig": "specdec.speculative_config",
}


def __getattr__(name: str) -> Any:
    # Lazy so that `specdec --help` and the CLI's argument errors do not wait for torch to import.
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
