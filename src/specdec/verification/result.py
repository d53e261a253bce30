from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verification:
    num_accepted: int  # how many draft tokens the target kept
    next_token: int  # the recovered token (after a rejection) or the bonus token (all accepted)
    # Draft indices of the kept tokens from the root down (root excluded). Chains may leave it out: it is
    # then filled in as 0..num_accepted-1, so chain results compare equal however they were built.
    path: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.path and self.num_accepted:
            object.__setattr__(self, "path", tuple(range(self.num_accepted)))
        elif len(self.path) != self.num_accepted:
            raise ValueError(f"a path of {len(self.path)} nodes for {self.num_accepted} accepted tokens")
