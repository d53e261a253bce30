"""Medusa heads (arXiv:2401.10774) and their static candidate trees.

Head k (0-based) maps the target's final normed hidden state h_t to a distribution over token t + 2 + k
(the target's own head predicts t + 1): `num_layers` ResBlocks x + SiLU(W x + b), then a vocabulary
projection. W and b start at zero, so every head starts as the target's own head. Each head and each
ResBlock has its own weights (the reference code's `[ResBlock] * n` shares them).

The projection is by default the target's LM head restricted to the draft vocabulary (shared, never
stored: 3.6 MB for four heads on Gemma 3 270M). With `own_lm_heads` every head has its own, as in Medusa-1,
FasterDecoding's checkpoints and vLLM's Medusa: `medusa_head.{k}.{num_layers}` (a bias-free Linear over the
draft vocabulary), which training starts from the target's rows.

A tree (`medusa_choices`) is a list of paths; element j of a path is a rank in head j's top-k, so path
[0, 2] is head 0's best candidate followed by head 1's third best.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.drafting.vocab_map import DraftVocab, head_logits
from specdec.models.fast_linear import linear, linear_float

TOP_K = 10  # ranks a tree may use per head (Medusa's TOPK)


@dataclass
class MedusaConfig:
    hidden_size: int
    num_heads: int
    num_layers: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    logit_softcap: float | None = None  # the target's final logit soft-cap
    own_lm_heads: bool = False  # each head its own vocabulary projection (else the target's LM head rows)

    def to_dict(self) -> dict:
        return asdict(self)


class ResBlock(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)  # identity at init: SiLU(0) = 0
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dim() != 2:
            return x + F.silu(self.linear(x))
        # inference: our row kernel (oneDNN is slow on bfloat16 calls of a few rows)
        return x + F.silu(linear(x.to(self.linear.weight.dtype), self.linear.weight, self.linear.bias))


class MedusaHeads(DraftVocab):
    def __init__(self, c: MedusaConfig) -> None:
        super().__init__()
        self.config = c
        # FasterDecoding's layout: head k is Sequential(ResBlock x num_layers[, Linear to the vocabulary])
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*[ResBlock(c.hidden_size) for _ in range(c.num_layers)],
                          *([nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)] if c.own_lm_heads else []))
            for _ in range(c.num_heads)
        )
        self._init_draft_vocab(c.vocab_size, c.draft_vocab_size)
        self._head: torch.Tensor | None = None

    def attach_target(self, head_weight: torch.Tensor, head_dtype: torch.dtype | None = None) -> None:
        """The target's LM head rows of the draft vocabulary: the heads' projection unless they have their
        own, and the rows training starts own projections from; `head_dtype` as in `head_rows`."""
        self._head = self.head_rows(head_weight, head_dtype)

    def start_own_heads_from_target(self) -> None:
        """Medusa-1's initialisation of own projections: every head starts as the target's LM head."""
        if not self.config.own_lm_heads or self._head is None:
            raise RuntimeError("only heads with own_lm_heads, after attach_target()")
        with torch.no_grad():
            for k in range(self.config.num_heads):
                self.projection(k).weight.copy_(self._head)

    def projection(self, k: int) -> nn.Linear:
        return self.medusa_head[k][self.config.num_layers]

    def head_state(self, k: int, h: torch.Tensor) -> torch.Tensor:
        """Head k's ResBlocks (not its own projection, if it has one)."""
        head = self.medusa_head[k]
        for j in range(self.config.num_layers):
            h = head[j](h)
        return h

    def head_rows_of(self, k: int) -> torch.Tensor:
        """[draft_vocab, H] the vocabulary projection of head k."""
        if self.config.own_lm_heads:
            return self.projection(k).weight
        if self._head is None:
            raise RuntimeError("attach_target() first: the heads use the target's LM head")
        return self._head

    def logits(self, states: torch.Tensor, k: int) -> torch.Tensor:
        """float32 logits over the draft vocabulary of head k's states."""
        return head_logits(states, self.head_rows_of(k), self.config.logit_softcap)

    def own_static_logits(self, states: torch.Tensor) -> torch.Tensor | None:
        """[num_heads, H] one state per head -> float32 [num_heads, draft_vocab] logits of their own
        projections before any soft-cap (None for heads that share the target's rows)."""
        if not self.config.own_lm_heads:
            return None
        rows = [self.projection(k).weight for k in range(self.config.num_heads)]
        return torch.cat([linear_float(states[k : k + 1].to(w.dtype), w) for k, w in enumerate(rows)])

    def all_logits(self, h: torch.Tensor) -> torch.Tensor:
        """[n, H] final normed hidden states -> [num_heads, n, draft_vocab] float32 logits."""
        return torch.stack([self.logits(self.head_state(k, h), k) for k in range(self.config.num_heads)])


# -- static trees ----------------------------------------------------------------------------------------

Path = tuple[int, ...]


def prior_accuracy(num_heads: int) -> list[list[float]]:
    """A generic guess at P(head j's rank-r candidate is right), used when a drafter carries no measured
    table: accuracy falls with the head's distance and with the rank."""
    return [[0.6 * 0.75**j * 0.45**r for r in range(TOP_K)] for j in range(num_heads)]


def tree_from_accuracy(accuracy: Sequence[Sequence[float]], num_nodes: int, max_depth: int | None = None) -> list[Path]:
    """The `num_nodes` paths of highest estimated probability (product of the per-head rank accuracies,
    as Medusa builds its trees). A child never scores above its parent, so the result is a tree."""
    depth = min(len(accuracy), max_depth or len(accuracy))
    chosen: list[Path] = []
    heap: list[tuple[float, Path]] = [(-accuracy[0][r], (r,)) for r in range(len(accuracy[0]))] if depth else []
    heapq.heapify(heap)
    while heap and len(chosen) < num_nodes:
        score, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < depth:
            row = accuracy[len(path)]
            for r in range(len(row)):
                heapq.heappush(heap, (score * row[r], (*path, r)))
    return sort_paths(chosen)


def sort_paths(paths: Sequence[Sequence[int]]) -> list[Path]:
    """By length, then lexicographically (Medusa's order): parents before children."""
    return sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))


def choice_problems(choices: Sequence[Sequence[int]], num_heads: int | None = None) -> list[str]:
    paths = [tuple(p) for p in choices]
    out = []
    if not paths or len(paths) > 63:
        out.append(f"medusa_choices must hold 1..63 paths, got {len(paths)}")
    for p in paths:
        if not p or any(not isinstance(r, int) or not 0 <= r < TOP_K for r in p):
            out.append(f"medusa_choices path {list(p)} must be a non-empty list of ranks in 0..{TOP_K - 1}")
        elif len(p) > 1 and p[:-1] not in paths:
            out.append(f"medusa_choices path {list(p)} needs its parent {list(p[:-1])} in the tree too")
        elif num_heads is not None and len(p) > num_heads:
            out.append(f"medusa_choices path {list(p)} is deeper than the drafter's {num_heads} heads")
    if len(set(paths)) != len(paths):
        out.append("medusa_choices repeats a path")
    return out


def tree_parents(paths: Sequence[Path]) -> list[int]:
    """Parent index of every path in `paths` (sorted by sort_paths), -1 for depth 1."""
    index = {p: i for i, p in enumerate(paths)}
    return [-1 if len(p) == 1 else index[p[:-1]] for p in paths]


def expected_accepted(accuracy: Sequence[Sequence[float]], paths: Sequence[Path]) -> float:
    """Estimated tokens per target forward (accepted + 1) of a tree under the independence assumption."""
    total = 1.0
    for p in paths:
        prob = 1.0
        for j, r in enumerate(p):
            prob *= accuracy[j][r] if j < len(accuracy) and r < len(accuracy[j]) else 0.0
        total += prob
    return total
