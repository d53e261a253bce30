"""Dynamic draft trees from MTP modules (the EAGLE-2 growth and rerank of dynamic_tree.py).

Depth k at position i reads the token t_{i+k} and depth k - 1's output at i (mtp.py). With positions
0..n committed and the pending token t_{n+1}, a tree node u at level L (its path drafts t_{n+2} ..
t_{n+1+L}) owns, at every depth k > L, the entry at position n + 1 + L - k: the one that reads u's own token.
Its input is the entry its parent owns at depth k - 1, same position (the root's are committed entries).

Growing level k runs depth k once, over its committed catch-up entries plus, for every node on a path to the
frontier, the entry it owns, under an ancestry mask: an owned entry sees the committed entries and the
entries owned by its own ancestors (the earlier positions of its path), never a sibling's. The frontier's
own entries sit at position n; their logits give the next level. As for chains, only the catch-up
entries, which read committed tokens only, stay in the caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specdec.drafting.base import Draft
from specdec.drafting.dynamic_tree import TreeNode, TreesInStep, min_score, tree_growth
from specdec.models.decoder import SequenceRows

if TYPE_CHECKING:
    from specdec.drafting.mtp import MTPState


@dataclass
class _DepthRows:
    """One grower's rows in a run of depth k's block: the catch-up entries [start, final), then owned ones."""

    x: torch.Tensor  # [m, H] block inputs
    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor
    start: int
    final: int
    owners: list[int]


class MTPTreeGrower:
    """One step's tree over an MTPState (draft_trees grows many at once)."""

    def __init__(self, state: MTPState, tokens: Sequence[int]) -> None:
        if state.length != len(tokens) - 1:
            raise RuntimeError(f"MTP state out of step: features of {state.length} positions, {len(tokens)} tokens")
        self.state, self.seq = state, list(tokens)
        self.n = state.length - 1  # the last committed position
        self.owned: dict[tuple[int, int], torch.Tensor] = {}  # (depth, node) -> that entry's output [H]

    def _position(self, k: int, node: TreeNode) -> int:
        """The position of the depth-k entry `node` owns (negative: none, the path starts too early)."""
        return self.n + 1 + node.depth - k

    def _rows(self, k: int, owners: list[int], nodes: list[TreeNode]) -> _DepthRows:
        """Depth k's rows: its catch-up entries and the entries `owners` own (topological order, each one's
        ancestors included), their cache entries claimed."""
        s = self.state
        d, cache, dev = s.drafter, s.caches[k - 1], s.features.device
        start, final = s.next_position(k), max(s.length + 1 - k, 0)
        source = s.features if k == 1 else s.outputs[k - 2]
        owners = [u for u in owners if self._position(k, nodes[u]) >= 0]
        owned_at = [self._position(k, nodes[u]) for u in owners]
        committed_ids, committed = s.entry_inputs(k, self.seq, start, final)  # the catch-up entries
        hidden = [committed]
        for u, pos in zip(owners, owned_at):
            p = nodes[u].parent
            hidden.append(source[pos : pos + 1] if p == -1 else self.owned[(k - 1, p)][None])
        drafted = s.to_target(torch.tensor([nodes[u].token for u in owners], dtype=torch.long, device=dev))
        ids = torch.cat([committed_ids, drafted.to(torch.long)])
        positions = list(range(start, final)) + owned_at
        c, m = final - start, final - start + len(owners)
        ancestry = torch.zeros(m, m, dtype=torch.bool, device=dev)
        ancestry[:c, :c] = torch.ones(c, c, dtype=torch.bool, device=dev).tril_()
        ancestry[c:, :c] = True
        row = {u: c + j for j, u in enumerate(owners)}
        for j, u in enumerate(owners):
            a = u
            while a != -1:
                if a in row:
                    ancestry[c + j, row[a]] = True
                a = nodes[a].parent
        x = d.module_for(k).project(d.embed(ids), torch.cat(hidden))
        mask, cos, sin, pos = s.reserve(k, m, start, ancestry, torch.tensor(positions, dtype=torch.long, device=dev))
        return _DepthRows(x, mask, cos, sin, pos, start, final, owners)

    def _keep(self, k: int, rows: _DepthRows, out: torch.Tensor) -> None:
        """Commits the catch-up entries of depth k's run (outputs `out` [m, H]) and records the owned ones."""
        self.state.keep(k, out, rows.start, rows.final)
        c = rows.final - rows.start
        for j, u in enumerate(rows.owners):
            self.owned[(k, u)] = out[c + j]

    def _logprobs(self, k: int, h: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.state.logits(k, h).float(), dim=-1).cpu()

    def grow(self, depth: int, top_k: int, total: int, min_score: float) -> list[TreeNode]:
        """This tree alone: the selected nodes (draft-vocabulary tokens)."""
        return grow_trees([self], [depth], top_k, total, min_score)[0]


def _run_depth(growers: Sequence[MTPTreeGrower], k: int, owners: Sequence[list[int]],
               nodes: Sequence[list[TreeNode]]) -> list[torch.Tensor]:
    """Depth k's block once over every grower's rows (row-invariant linears, attention per sequence over its
    own cache); returns each grower's outputs [rows, H]."""
    runs = [g._rows(k, o, n) for g, o, n in zip(growers, owners, nodes)]
    block = growers[0].state.drafter.module_for(k).block
    sequences, row = [], 0
    for g, r in zip(growers, runs):
        m = r.x.shape[0]
        sequences.append(SequenceRows(row, row + m, g.state.caches[k - 1], {block.window: r.mask}))
        row += m
    out = block.forward_batch(torch.cat([r.x for r in runs]), torch.cat([r.cos for r in runs]),
                              torch.cat([r.sin for r in runs]), sequences, torch.cat([r.positions for r in runs]))
    outs = []
    for g, r, seq in zip(growers, runs, sequences):
        h = out[seq.start : seq.end]
        g._keep(k, r, h)
        outs.append(h)
    return outs


def _paths_to(frontier: list[int], nodes: list[TreeNode]) -> list[int]:
    """Every node on a path to the frontier, in creation (topological) order."""
    on_paths: set[int] = set()
    for f in frontier:
        a = f
        while a != -1 and a not in on_paths:
            on_paths.add(a)
            a = nodes[a].parent
    return sorted(on_paths)


@torch.inference_mode()
def draft_trees(states: Sequence[MTPState], tokens: Sequence[Sequence[int]], depths: Sequence[int], top_k: int,
                total: int, threshold: float) -> list[Draft]:
    """Dynamic trees of point-mass nodes (top-k children, the `total` likeliest kept; growth stops once no
    frontier path is likelier than `threshold`) for states sharing one drafter (see grow_trees)."""
    selected = grow_trees([MTPTreeGrower(s, t) for s, t in zip(states, tokens)], depths, top_k, total,
                          min_score(threshold))
    drafts = []
    for s, nodes in zip(states, selected):
        ids = s.to_target(torch.tensor([n.token for n in nodes], dtype=torch.long, device=s.features.device))
        drafts.append(Draft(tokens=[int(t) for t in ids.tolist()], parents=[n.parent for n in nodes]))
    return drafts


def grow_trees(growers: Sequence[MTPTreeGrower], depths: Sequence[int], top_k: int, total: int,
               min_score: float) -> list[list[TreeNode]]:
    """Every grower's selected nodes, the trees grown level by level together: each level runs its depth's
    block once for every tree still growing. Each tree is the one its grower grows alone."""
    roots = _run_depth(growers, 1, [[] for _ in growers], [[] for _ in growers])  # depth 1's entry at position n
    trees = TreesInStep([tree_growth(g._logprobs(1, h[-1:])[0], top_k, min(depth, len(g.state.caches)), total,
                                     min_score) for g, h, depth in zip(growers, roots, depths)])
    requests = trees.requests
    while requests:
        levels: dict[int, list[int]] = {}  # trees grow in step, so one level; grouped all the same
        for j, (frontier, nodes) in requests.items():
            levels.setdefault(nodes[frontier[0]].depth + 1, []).append(j)
        for k, members in sorted(levels.items()):
            frontiers = {j: requests[j] for j in members}
            _run_depth([growers[j] for j in members], k, [_paths_to(*frontiers[j]) for j in members],
                       [frontiers[j][1] for j in members])
            for j in members:
                g, frontier = growers[j], frontiers[j][0]
                trees.feed(j, g._logprobs(k, torch.stack([g.owned[(k, f)] for f in frontier])))
    return trees.selected
