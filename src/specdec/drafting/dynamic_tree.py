"""EAGLE-2 style dynamic draft trees, independent of the network that scores them.

Grow: the root's top-k children form the first frontier; each round feeds the frontier to the drafter
(one forward), gives every fed node its top-k children with cumulative log-probabilities, and keeps the
global top-k of those as the next frontier, until `depth` levels or until no frontier node's path is
likelier than `min_score` (a log-probability: deeper levels could only score lower, so the drafter
forwards for them are saved). Rerank: keep the `total` best nodes of everything generated.
Scores only fall along a path, so that set is a subtree; orphans (possible on exact ties) are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch


@dataclass
class TreeNode:
    token: int  # draft-vocabulary id
    parent: int  # index in the node list, -1 = root
    score: float  # cumulative log-probability of the path
    depth: int  # 1 = child of the root


# feeds frontier nodes (indices into the node list) to the drafter and returns their log-probs [n, draft_vocab]
Expand = Callable[[list[int], list[TreeNode]], torch.Tensor]


def min_score(confidence_threshold: float) -> float:
    """`confidence_threshold` (a path probability, 0 = off) as grow_tree's `min_score` (a log-probability)."""
    return math.log(confidence_threshold) if confidence_threshold > 0 else float("-inf")


# what tree_growth asks for: the frontier (indices into the node list) to feed, and the node list so far
Frontier = tuple[list[int], list[TreeNode]]


def tree_growth(root_logprobs: torch.Tensor, top_k: int, depth: int, total: int,
                min_score: float = float("-inf")) -> Generator[Frontier, torch.Tensor, list[TreeNode]]:
    """grow_tree one frontier at a time: yields each frontier to feed and takes its log-probs
    [len(frontier), V] back; returns the selected nodes. A caller can grow the trees of many sequences
    level by level this way, one drafter forward for all their frontiers."""
    nodes: list[TreeNode] = []
    scores, tokens = root_logprobs.topk(min(top_k, root_logprobs.numel()))
    frontier = []
    for s, t in zip(scores.tolist(), tokens.tolist()):
        frontier.append(len(nodes))
        nodes.append(TreeNode(t, -1, s, 1))
    for level in range(2, depth + 1):
        if max(nodes[i].score for i in frontier) < min_score:
            break
        logprobs = yield frontier, nodes  # [len(frontier), V]
        parent_scores = torch.tensor([nodes[i].score for i in frontier], dtype=logprobs.dtype)
        child_lp, child_tok = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
        cumulative = child_lp + parent_scores[:, None]
        children = []
        for row, parent in enumerate(frontier):
            for s, t in zip(cumulative[row].tolist(), child_tok[row].tolist()):
                children.append(len(nodes))
                nodes.append(TreeNode(t, parent, s, level))
        best = sorted(children, key=lambda i: -nodes[i].score)[:top_k]
        frontier = sorted(best)
    return select_subtree(nodes, total)


class TreesInStep:
    """Several trees' tree_growth generators driven together: `requests` holds each tree still growing and
    the frontier it wants fed next; `feed` gives a tree its frontier's log-probs; `selected[j]` is tree j's
    result once it stops. A caller feeds every request of a round from one drafter forward."""

    def __init__(self, growths: list[Generator[Frontier, torch.Tensor, list[TreeNode]]]) -> None:
        self.growths = growths
        self.requests: dict[int, Frontier] = {}
        self.selected: list[list[TreeNode]] = [[] for _ in growths]
        for j in range(len(growths)):
            self._advance(j, None)

    def _advance(self, j: int, logprobs: torch.Tensor | None) -> None:
        try:
            self.requests[j] = next(self.growths[j]) if logprobs is None else self.growths[j].send(logprobs)
        except StopIteration as done:
            self.requests.pop(j, None)
            self.selected[j] = done.value

    def feed(self, j: int, logprobs: torch.Tensor) -> None:
        self._advance(j, logprobs)


def grow_tree(root_logprobs: torch.Tensor, expand: Expand, top_k: int, depth: int, total: int,
              min_score: float = float("-inf")) -> list[TreeNode]:
    """Returns the selected nodes in topological order with parents re-indexed into the returned list."""
    tree = TreesInStep([tree_growth(root_logprobs, top_k, depth, total, min_score)])
    while tree.requests:
        tree.feed(0, expand(*tree.requests[0]))
    return tree.selected[0]


def select_subtree(nodes: list[TreeNode], total: int) -> list[TreeNode]:
    keep = set(sorted(range(len(nodes)), key=lambda i: -nodes[i].score)[:total])
    order = [i for i in range(len(nodes)) if i in keep]  # creation order is topological
    index: dict[int, int] = {}
    out: list[TreeNode] = []
    for i in order:
        node = nodes[i]
        if node.parent != -1 and node.parent not in index:
            continue  # orphan: its parent lost a tie at the cut
        index[i] = len(out)
        out.append(TreeNode(node.token, -1 if node.parent == -1 else index[node.parent], node.score, node.depth))
    return out
