"""Tree-drafting proposers for the tests: random trees around a known script, and draft-model top-k trees."""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace

import torch
from specdec.drafting.base import Draft, Proposer
from specdec.drafting.draft_model import fit_vocab
from specdec.models.runtime import ForwardResult, ModelRuntime
from specdec.verification import sampling_probs

MAX_NODES = 63  # the engine's MAX_TOKENS_PER_FORWARD - 1


def random_topological_order(parents: list[int], rng: random.Random) -> tuple[list[int], list[int]]:
    """A random order in which every node still comes after its parent: (order, remapped parents)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    ready, order = list(children.get(-1, [])), []
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        order.append(node)
        ready.extend(children.get(node, []))
    new = {old: j for j, old in enumerate(order)}
    return order, [-1 if parents[i] < 0 else new[parents[i]] for i in order]


class ScriptTreeProposer(Proposer):
    """Random point-mass trees around a known continuation (the target's greedy output): each child is the
    script's next token with probability `hit` when its path is still on the script, else a random token;
    siblings sometimes repeat a token. Shapes: random widths 1..width, depth up to `depth` (not capped by
    max_tokens unless `respect_max_tokens`: the engine must cut it), nodes in a random topological order."""

    Options = SimpleNamespace

    def __init__(
        self, script: Sequence[int], vocab: int, depth: int, width: int, hit: float = 0.7, seed: int = 0,
        duplicate: float = 0.3, respect_max_tokens: bool = False, max_nodes: int = MAX_NODES,
    ) -> None:
        super().__init__(SimpleNamespace(num_speculative_tokens=depth), target=None)
        self.script, self.vocab, self.depth, self.width = list(script), vocab, depth, width
        self.hit, self.duplicate, self.respect, self.max_nodes = hit, duplicate, respect_max_tokens, max_nodes
        self.rng = random.Random(seed)
        self.drafts: list[tuple[int, int, Draft]] = []  # (len(tokens), max_tokens, draft) per propose
        self.feedbacks: list[tuple[int, list[int] | None, ForwardResult | None]] = []

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        n = len(tokens)
        assert list(tokens) == self.script[:n], "the target left the script"
        depth = min(self.depth, max_tokens) if self.respect else self.depth
        toks, parents = [], []
        frontier = [(-1, True)]  # (node, whether its path so far follows the script)
        for level in range(depth):
            nxt = []
            for node, on_script in frontier:
                right = self.script[n + level] if on_script and n + level < len(self.script) else None
                kids: list[int] = []
                for _ in range(self.rng.randint(1, self.width)):
                    if kids and self.rng.random() < self.duplicate:
                        kids.append(self.rng.choice(kids))
                    elif right is not None and right not in kids and self.rng.random() < self.hit:
                        kids.append(right)
                    else:
                        kids.append(self.rng.randrange(self.vocab))
                for t in kids:
                    if len(toks) == self.max_nodes:
                        break
                    toks.append(t)
                    parents.append(node)
                    nxt.append((len(toks) - 1, t == right))
            frontier = nxt
        order, parents = random_topological_order(parents, self.rng)
        draft = Draft(tokens=[toks[i] for i in order], parents=parents)
        self.drafts.append((n, max_tokens, draft))
        return draft

    def feedback(self, num_accepted, verified=None, path=None) -> None:
        self.feedbacks.append((num_accepted, None if path is None else list(path), verified))


class DraftTreeProposer(Proposer):
    """A draft model's tree: every node gets `top_k` children, level by level up to `depth` (and MAX_NODES
    nodes). Greedy or `sample=False`: the top-k tokens, point masses. Sampling with `sample=True`: top_k
    i.i.d. samples from the draft's warped distribution at the parent, with those distributions as probs."""

    Options = SimpleNamespace

    def __init__(self, runtime: ModelRuntime, vocab: int, top_k: int, depth: int, sample: bool = False) -> None:
        super().__init__(SimpleNamespace(num_speculative_tokens=depth), target=None)
        self.runtime, self.vocab, self.top_k, self.depth, self.sample = runtime, vocab, top_k, depth, sample
        self.cached = 0

    def begin(self, prompt, sampling, generator, capacity, prefill=None) -> None:
        self.runtime.reset(capacity)
        self.cached, self.sampling, self.generator = 0, sampling, generator

    def _children(self, logits: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
        logits = fit_vocab(logits, self.vocab)
        s = self.sampling
        if not self.sample or s.greedy:
            return torch.topk(logits, self.top_k).indices.tolist(), None
        q = sampling_probs(logits[None], s.temperature, s.top_k, s.top_p)[0]
        return torch.multinomial(q, self.top_k, replacement=True, generator=self.generator).tolist(), q

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        # The draft cache holds committed context only; each level re-forwards the tree (never committed).
        context = list(tokens[:-1])
        if len(context) > self.cached:
            self.runtime.prefill(context[self.cached :])
            self.cached = len(context)
        toks: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        frontier = [-1]
        for _ in range(min(self.depth, max_tokens)):
            if not frontier:
                break
            logits = self.runtime.forward([tokens[-1], *toks], parents=[-1, *(p + 1 for p in parents)]).logits
            nxt = []
            for node in frontier:
                kids, q = self._children(logits[node + 1])
                for t in kids[: MAX_NODES - len(toks)]:
                    toks.append(t)
                    parents.append(node)
                    if q is not None:
                        rows.append(q)
                    nxt.append(len(toks) - 1)
            frontier = nxt
        return Draft(tokens=toks, parents=parents, probs=torch.stack(rows) if rows else None)
