from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verification:
    num_accepted: int  # how many leading draft tokens the target kept
    next_token: int  # the recovered token (after a rejection) or the bonus token (all accepted)
