"""What `specdec check` runs and where it draws the lines; light to import (the CLI parser reads its defaults)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.defaults import DEFAULT_MODEL

if TYPE_CHECKING:
    from specdec.speculative_config import SpeculativeConfig

DEFAULT_CONFIG = {"method": "ngram", "num_speculative_tokens": "auto"}


@dataclass
class CheckSettings:
    model: str = DEFAULT_MODEL
    dtype: str = "bfloat16"
    device: str | None = None
    quantization: str | None = None
    configs: Sequence[dict[str, Any] | SpeculativeConfig] = (DEFAULT_CONFIG,)
    cases: str | Path | None = None  # None: the shipped set
    limit: int | None = None
    kinds: Sequence[str] | None = None
    max_new_tokens: int = 64
    batch_size: int = 8
    min_acceptance: float = 0.3
    min_speedup: float | None = None
    sampling_cases: int = 2
    samples: int = 96
    sampling_tokens: int = 8  # the first is sampled before any draft: 7 verified positions per sample
    alpha: float = 1e-3
    seed: int = 0
    progress: bool = True

    def problems(self) -> list[str]:
        checks = [
            (self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (0 <= self.min_acceptance <= 1, f"--min-acceptance must be in [0, 1], got {self.min_acceptance}"),
            (self.min_speedup is None or self.min_speedup >= 0, f"--min-speedup must be >= 0, got {self.min_speedup}"),
            (self.sampling_cases >= 0, f"--sampling-cases must be >= 0, got {self.sampling_cases}"),
            (self.samples >= 1, f"--samples must be >= 1, got {self.samples}"),
            (self.sampling_tokens >= 2, f"--sampling-tokens must be >= 2 (drafts are verified from the second "
                                        f"token on), got {self.sampling_tokens}"),
            (0 < self.alpha < 1, f"--alpha must be in (0, 1), got {self.alpha}"),
            (bool(self.configs), "no speculative config to check"),
        ]
        return [message for ok, message in checks if not ok]
