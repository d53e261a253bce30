"""The training state a `--resume` continues from: model and optimizer state dicts, progress counters and
settings, i.e. tensors, plain containers, numbers and strings only, so that it is read with
`torch.load(weights_only=True)`: a checkpoint copied from elsewhere cannot run code when it is resumed."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from specdec.atomic_write import atomic_file


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Written atomically: a crash leaves the previous checkpoint or this one."""
    with atomic_file(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path} holds objects other than tensors, numbers, strings and plain containers; it is "
                         f"not loaded, since unpickling them could run code (not a checkpoint this trainer wrote?)"
                         ) from exc
