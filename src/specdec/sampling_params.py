"""SamplingParams, in vLLM's shape and with vLLM's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy (argmax); top_k 0 or -1 and top_p 1.0 disable those filters."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        problems = []
        if not self.temperature >= 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if not (type(self.top_k) is int and self.top_k >= 0):
            problems.append(f"top_k must be an int >= 0 (0 or -1 disables it), got {self.top_k}")
        if not (type(self.max_tokens) is int and self.max_tokens >= 1):
            problems.append(f"max_tokens must be an int >= 1, got {self.max_tokens}")
        if self.seed is not None and type(self.seed) is not int:
            problems.append(f"seed must be an int, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            problems.append(f"stop must be non-empty strings, got {self.stop!r}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
