"""Target features of committed positions that a drafter has not read yet, gathered only when it reads them.

A drafter that works on the target's hidden states (EAGLE-3) reads each committed position once. The
positions arrive with every verification forward, but the drafter reads them only in a step where it
drafts. Gathering their features at each commit cost a few tensor ops per sequence and step even when the
auto policy drafted nothing: at 32 sequences, EAGLE-3 forced to draft nothing ran at 0.93x plain. Here a
commit only keeps a reference to the forward's hidden states; the features are gathered when they are read.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MAX_PARTS = 32  # held forwards beyond which they are gathered into one tensor (bounds what stays referenced)


class PendingFeatures:
    """Rows of the target's hidden states at `layers`, concatenated along the last axis, in commit order."""

    def __init__(self, layers: Sequence[int]) -> None:
        self.layers = tuple(layers)
        # each part: the hidden states of one forward by layer and its committed rows (None: all of them), or
        # (None, features) for rows already gathered
        self._parts: list[tuple[dict[int, torch.Tensor] | None, torch.Tensor | list[int] | None]] = []
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def add(self, hidden: dict[int, torch.Tensor], rows: list[int] | None = None) -> None:
        """Keeps rows `rows` (all when None) of one forward's hidden states, gathered later."""
        n = hidden[self.layers[0]].shape[0] if rows is None else len(rows)
        if n == 0:
            return
        self._parts.append((hidden, rows))
        self._rows += n
        if len(self._parts) > MAX_PARTS:
            self._parts = [(None, self._gather())]

    def take(self, n: int | None = None) -> torch.Tensor:
        """The first `n` pending rows' features [n, len(layers) * H] (all when None); they stop being pending."""
        features = self._gather()
        n = features.shape[0] if n is None else n
        if not 0 <= n <= features.shape[0]:
            raise ValueError(f"{n} rows asked of {features.shape[0]} pending")
        rest = features[n:]
        self._parts = [(None, rest)] if rest.shape[0] else []
        self._rows = int(rest.shape[0])
        return features[:n]

    def _gather(self) -> torch.Tensor:
        pieces = []
        for hidden, rows in self._parts:
            if hidden is None:
                assert isinstance(rows, torch.Tensor)
                pieces.append(rows)
                continue
            if rows is None:
                pieces.append(torch.cat([hidden[i] for i in self.layers], dim=-1))
            else:
                index = torch.as_tensor(rows, dtype=torch.long, device=hidden[self.layers[0]].device)
                pieces.append(torch.cat([hidden[i][index] for i in self.layers], dim=-1))
        if not pieces:
            raise ValueError("no pending features")
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)
