"""Fine-tuning a learned drafter from a saved one (`specdec train <method> --init-from DIR`).

The new drafter takes the saved one's architecture and weights. Its draft vocabulary is the saved one's,
or the most frequent part of it when a smaller `--draft-vocab-size` is asked for: every learned drafter
predicts through the target's own LM-head rows of its draft vocabulary, so the trained weights do not
depend on which rows are kept (see `shrink_vocab`). A vocabulary cannot grow: new rows would have no
trained meaning the drafter could rely on.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from pathlib import Path

import torch
from torch import nn

from specdec.training.draft_vocab import frequent_tokens

VOCAB_BUFFERS = ("d2t", "t2d")


def start_vocabulary(start_ids: torch.Tensor, size: int | None, responses: Iterable[Sequence[int]],
                     vocab_size: int, fallback: Callable[[], Iterable[Sequence[int]]], source: Path) -> torch.Tensor:
    """The fine-tuned drafter's draft tokens: the start's, or its `size` most frequent in `responses`
    (ties and unseen tokens ranked by `fallback()`, called only when shrinking)."""
    size = size or start_ids.numel()
    if size > start_ids.numel():
        raise ValueError(f"--draft-vocab-size {size} is larger than the vocabulary of {source} "
                         f"({start_ids.numel()}): a fine-tuned drafter's vocabulary can only shrink")
    if size == start_ids.numel():
        return start_ids
    return frequent_tokens(responses, size, vocab_size, fallback=fallback(), within=start_ids)


def copy_trained_weights(model: nn.Module, start: nn.Module, source: Path, added: Container[str] = ()) -> None:
    """Loads every weight of `start` into `model` (same architecture, or grown by the parameters named in
    `added`, which keep their own initialisation) except the vocabulary maps."""
    weights = {k: v for k, v in start.state_dict().items() if k not in VOCAB_BUFFERS}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k not in VOCAB_BUFFERS and k not in added]
    if missing or unexpected:
        raise ValueError(f"the drafter in {source} does not match the model being trained "
                         f"(missing {missing[:5]}, unexpected {unexpected[:5]})")


def check_shape(asked: dict[str, int | None], start: dict[str, int], source: Path) -> None:
    """Refuses shape options (None: not given) that contradict the drafter being fine-tuned."""
    clashes = [f"{name} {value} (it has {start[name]})" for name, value in asked.items()
               if value is not None and value != start[name]]
    if clashes:
        raise ValueError(f"--init-from {source} fixes the drafter's shape; asked for " + ", ".join(clashes))
