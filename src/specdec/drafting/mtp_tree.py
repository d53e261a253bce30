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
from typing import TYPE_CHECKING

import torch

from specdec.drafting.dynamic_tree import TreeNode, grow_tree

if TYPE_CHECKING:
    from specdec.drafting.mtp import MTPState


class MTPTreeGrower:
    """One step's tree over an MTPState: `grow` returns the selected nodes (draft-vocabulary tokens)."""

    def __init__(self, state: MTPState, tokens: Sequence[int]) -> None:
        if state.length != len(tokens) - 1:
            raise RuntimeError(f"MTP state out of step: features of {state.length} positions, {len(tokens)} tokens")
        self.state, self.seq = state, list(tokens)
        self.n = state.length - 1  # the last committed position
        self.owned: dict[tuple[int, int], torch.Tensor] = {}  # (depth, node) -> that entry's output [H]

    def _position(self, k: int, node: TreeNode) -> int:
        """The position of the depth-k entry `node` owns (negative: none, the path starts too early)."""
        return self.n + 1 + node.depth - k

    def _run_depth(self, k: int, owners: list[int], nodes: list[TreeNode]) -> torch.Tensor:
        """Depth k over its catch-up entries and the entries `owners` own (topological order, each one's
        ancestors included); commits the catch-up entries and returns every row's output [rows, H]."""
        s = self.state
        d, cache, dev = s.drafter, s.caches[k - 1], s.features.device
        start, final = cache.length, max(s.length + 1 - k, 0)
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
        module = d.module_for(k)
        x = module.project(d.embed(ids), torch.cat(hidden))
        out = s.run(k, x, start, ancestry, torch.tensor(positions, dtype=torch.long, device=dev))
        s.keep(k, out, start, final)
        for j, u in enumerate(owners):
            self.owned[(k, u)] = out[c + j]
        return out

    def _logprobs(self, k: int, h: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.state.logits(k, h).float(), dim=-1).cpu()

    def grow(self, depth: int, top_k: int, total: int, min_score: float) -> list[TreeNode]:
        depth = min(depth, len(self.state.caches))
        root = self._logprobs(1, self._run_depth(1, [], [])[-1:])[0]  # depth 1's entry at position n

        def expand(frontier: list[int], nodes: list[TreeNode]) -> torch.Tensor:
            k = nodes[frontier[0]].depth + 1
            on_paths: set[int] = set()
            for f in frontier:
                a = f
                while a != -1 and a not in on_paths:
                    on_paths.add(a)
                    a = nodes[a].parent
            self._run_depth(k, sorted(on_paths), nodes)  # creation order is topological
            return self._logprobs(k, torch.stack([self.owned[(k, f)] for f in frontier]))

        return grow_tree(root, expand, top_k, depth, total, min_score)
