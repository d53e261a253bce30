"""SamplingParams, in vLLM's shape and with vLLM's defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specdec.value_checks import as_int, as_real, token_ids

# Below this, logits / temperature can overflow float32 (1e-300 even rounds to 0 there): inf logits, NaN
# probabilities, and a failure inside multinomial mid-generation. vLLM raises smaller temperatures to 0.01
# with a warning; we refuse them instead, as the server does.
MIN_TEMPERATURE = 0.01
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


@dataclass
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy (argmax), otherwise at least MIN_TEMPERATURE; top_k 0 or
    -1 and top_p 1.0 disable those filters. Numbers are normalised to Python float and int."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        problems = self._number_problems() + self._stop_problems()
        if not isinstance(self.ignore_eos, bool):
            problems.append(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if problems:
            raise ValueError("; ".join(problems))

    def _number_problems(self) -> list[str]:
        problems = []
        temperature = as_real(self.temperature)
        if temperature is None:
            problems.append(f"temperature must be a number, got {self.temperature!r}")
        elif not temperature >= 0:  # NaN too
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        elif temperature == math.inf:
            problems.append("temperature must be finite, got inf")
        elif 0 < temperature < MIN_TEMPERATURE:
            problems.append(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {temperature}")
        else:
            self.temperature = temperature
        top_p = as_real(self.top_p)
        if top_p is None or not 0 < top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p!r}")
        else:
            self.top_p = top_p
        top_k = as_int(self.top_k)
        if top_k is None or top_k < -1:
            problems.append(f"top_k must be an int >= 0 (0 or -1 disables it), got {self.top_k!r}")
        else:
            self.top_k = max(top_k, 0)
        max_tokens = as_int(self.max_tokens)
        if max_tokens is None or max_tokens < 1:
            problems.append(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        else:
            self.max_tokens = max_tokens
        if self.seed is not None:
            seed = as_int(self.seed)
            if seed is None or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
                problems.append(f"seed must be an int in [-2**63, 2**64 - 1] or None, got {self.seed!r}")
            else:
                self.seed = seed
        return problems

    def _stop_problems(self) -> list[str]:
        problems = []
        stop: Any = self.stop
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, (list, tuple)) or any(not isinstance(s, str) or not s for s in stop):
            problems.append(f"stop must be non-empty strings, got {self.stop!r}")
        else:
            self.stop = list(stop)
        try:
            ids = [] if self.stop_token_ids is None else token_ids(self.stop_token_ids, "stop_token_ids")
        except ValueError as exc:
            problems.append(str(exc))
        else:
            self.stop_token_ids = ids
        return problems

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
