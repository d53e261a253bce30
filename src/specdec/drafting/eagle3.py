"""EAGLE-3 drafting: chains (top-1, K tokens) and dynamic draft trees (EAGLE-2 style).

The drafter keeps its own KV cache over committed positions only: position t holds the entry computed
from the target's fused features at t and the token at t + 1. Each step it first ingests the positions
the last verification committed (their target features arrive through `feedback`), then drafts; the
entries of drafted tokens are discarded afterwards, since the target's features replace them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specdec.drafting.base import CATCH_UP_ROWS, Draft, Proposer
from specdec.drafting.confidence import keeps_drafting, threshold_problems
from specdec.drafting.context_vocab import ContextVocab, greedy_tops
from specdec.drafting.dynamic_tree import TreesInStep, min_score, tree_growth
from specdec.drafting.eagle3_format import load_eagle3
from specdec.drafting.drafter_format import shared_drafter
from specdec.drafting.eagle3_model import DraftKVCache, Eagle3Drafter, ListedVisibility, draft_cache_dtype
from specdec.drafting.int8_weights import (AUTO, EVERY_BUILD, W8A8, mode_problems, uses_int8,
                                           with_int8_weights)
from specdec.drafting.option_checks import draft_shape_problems
from specdec.drafting.pending_features import PendingFeatures
from specdec.drafting.registry import register
from specdec.drafting.shipped import resolve_drafter
from specdec.verification.probabilities import sample, sampling_probs

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel
    from specdec.models.runtime import ForwardResult
    from specdec.sampling_params import SamplingParams


@dataclass
class Eagle3Options:
    model: str
    num_speculative_tokens: int = 5  # chain length; the tree's depth when tree_top_k > 1
    tree_top_k: int = 1  # children per expanded node (SGLang --speculative-eagle-topk); 1 = chain
    tree_num_draft_tokens: int = 16  # nodes kept after reranking (SGLang --speculative-num-draft-tokens)
    # chains: stop after a token drafted with less probability (confidence.py); trees: stop growing once
    # no frontier path is that likely
    confidence_threshold: float = 0.0
    # also let the drafter propose every token of the request's context (prompt and output so far) that is
    # outside its draft vocabulary, through the target's LM head rows (context_vocab.py)
    context_vocab: bool = True
    # the drafter's linears on int8 copies (int8_weights.py; vLLM's key for the draft model's quantization):
    # "auto" where this CPU's int8 kernels are the fast ones, "w8a8_int8", or "none" / null (bfloat16 as stored)
    quantization: str | None = AUTO

    def problems(self) -> list[str]:
        out = threshold_problems(self.confidence_threshold) + mode_problems(self.quantization)
        return out + draft_shape_problems(self.num_speculative_tokens, self.tree_top_k, self.tree_num_draft_tokens)


PROMPT_CHUNK = 512  # pending positions the drafter reads per call when catching up (bounds its score matrix)


@register("eagle3")
class Eagle3Proposer(Proposer):
    Options = Eagle3Options

    def __init__(self, options: Eagle3Options, target: LoadedModel) -> None:
        super().__init__(options, target)
        if target.decoder is None:
            raise ValueError("eagle3 needs the target's hidden states, which only the native runtime provides")
        decoder = target.decoder
        path = resolve_drafter(options.model)
        int8 = uses_int8(options.quantization, target.device, EVERY_BUILD)

        def build() -> Eagle3Drafter:
            return with_int8_weights(load_eagle3(path, target)[0].ready_for(target), options.quantization, int8)

        drafter = self.drafter = shared_drafter(target, "eagle3", path, build, variant=W8A8 if int8 else "")
        self.target_layers = tuple(drafter.config.aux_layer_ids)
        self.cache: DraftKVCache | None = None
        self.vocab = ContextVocab(self.drafter.draft_ids(), self.drafter._head, decoder.head_weight(),
                                  enabled=options.context_vocab)
        self.vocab.static_weight = drafter.head_weight_for_drafting()
        self.pending: PendingFeatures | None = None  # committed positions the drafter has not read yet
        self.sampling: SamplingParams | None = None
        self.generator: torch.Generator | None = None
        self.vocab_size = target.vocab_size

    @property
    def is_tree(self) -> bool:
        return self.options.tree_top_k > 1

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, generator: torch.Generator | None,
              capacity: int, prefill: ForwardResult | None = None) -> None:
        if prefill is None:
            raise ValueError("eagle3 needs the target's prefill forward")
        c = self.drafter.config
        room = self.options.num_speculative_tokens * max(self.options.tree_top_k, 1) + 8
        self.cache = DraftKVCache(c.num_key_value_heads, c.head_dim, capacity + room,
                                  draft_cache_dtype(self.drafter.fc.weight), self.target.device)
        # the prompt is read by the first step that drafts (catch_up_batch): a request that the auto policy
        # never gives a draft costs no drafter work at all
        self.pending = PendingFeatures(self.target_layers)
        self.pending.add(prefill.hidden)
        self.sampling, self.generator = sampling, generator
        self.vocab.reset()

    @classmethod
    def catch_up_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]]) -> None:
        """Reads the committed positions still pending (the prompt, the tokens of steps without a draft) but
        the last one through the drafter, for every proposer with more than CATCH_UP_ROWS of them: one drafter
        step per PROMPT_CHUNK positions for all of them (a 30k x 30k score matrix per head otherwise)."""
        behind = [(p, t) for p, t in zip(proposers, tokens)
                  if isinstance(p, Eagle3Proposer) and p.pending is not None and len(p.pending) > CATCH_UP_ROWS]
        by_drafter: dict[int, list[tuple[Eagle3Proposer, Sequence[int]]]] = {}
        for p, t in behind:
            by_drafter.setdefault(id(p.drafter), []).append((p, t))  # type: ignore[arg-type]
        with torch.inference_mode():
            for group in by_drafter.values():
                while group:
                    inputs = [p._ingest_inputs(t, min(len(p.pending) - 1, PROMPT_CHUNK)) for p, t in group]  # type: ignore[arg-type]
                    _step_batch([p for p, _ in group], inputs)
                    group = [(p, t) for p, t in group if len(p.pending) > 1]  # type: ignore[arg-type]

    def _to_target(self, local_ids: torch.Tensor) -> torch.Tensor:
        return self.vocab.to_target(local_ids)

    def _ingest_inputs(self, tokens: Sequence[int], n: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The step inputs (features, next tokens, positions, rows: causal) of the first `n` pending committed
        positions (all when None); they stop being pending."""
        assert self.cache is not None and self.pending is not None
        start, pending = self.cache.length, len(self.pending)
        if start + pending + 1 != len(tokens):
            raise RuntimeError(f"eagle3 state out of step: {start} + {pending} ingested, {len(tokens)} tokens")
        n = pending if n is None else n
        dev = self.target.device
        nxt = torch.as_tensor(list(tokens[start + 1 : start + n + 1]), dtype=torch.long, device=dev)
        positions = torch.arange(start, start + n, device=dev)
        return self.pending.take(n), nxt, positions, n

    def _pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """Next chain token (target id) from draft-vocab logits [Vd]; q over the target vocab when sampling."""
        s = self.sampling
        if s is None or s.greedy:
            return int(self._to_target(logits.argmax())), None
        full = logits.new_full((self.vocab_size,), float("-inf"))
        full[self._to_target(torch.arange(logits.numel(), device=logits.device))] = logits
        q = sampling_probs(full[None], s.temperature, s.top_k, s.top_p)[0]
        return sample(q, self.generator), q

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        # the batched paths with one sequence: a draft alone is, by construction, the one drafted in a batch
        return (_tree_batch if self.is_tree else _chains)([self], [tokens], [max_tokens])[0]

    @classmethod
    def propose_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]],
                      max_tokens: Sequence[int]) -> list[Draft]:
        """Drafts of the sequences that share a drafter: one drafter step for all of them per drafted
        position (chains) or tree level (trees), and one for the positions they ingest, each step's
        LM-head rows in one call. Every draft is the one `propose` gives: the drafter's linears are
        row-invariant in bfloat16 on CPU, its attention runs per sequence."""
        out: list[Draft | None] = [None] * len(proposers)
        groups: dict[tuple[int, bool], list[int]] = {}
        for i, p in enumerate(proposers):
            if not isinstance(p, Eagle3Proposer):
                raise TypeError("propose_batch takes eagle3 proposers only")
            groups.setdefault((id(p.drafter), p.is_tree), []).append(i)
        for (_, tree), members in groups.items():
            draft = _tree_batch if tree else _chains
            drafts = draft([proposers[i] for i in members], [tokens[i] for i in members],  # type: ignore[misc]
                           [max_tokens[i] for i in members])
            for i, d in zip(members, drafts):
                out[i] = d
        return [d for d in out if d is not None]

    def feedback(self, num_accepted: int, verified: ForwardResult | None = None,
                 path: Sequence[int] | None = None) -> None:
        if verified is None:
            raise RuntimeError("eagle3 needs the verification forward's hidden states")
        kept = [0, *(i + 1 for i in path)] if path is not None else list(range(num_accepted + 1))
        assert self.pending is not None, "feedback before begin"
        self.pending.add(verified.hidden, kept)  # gathered when a step drafts (PendingFeatures)


@torch.inference_mode()
def _chains(ps: Sequence[Eagle3Proposer], tokens: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[Draft]:
    """Top-1 chains (stopped early below confidence_threshold) of proposers sharing one drafter, every drafter
    step batched. Greedy sequences pick their tokens from `greedy_tops` over all of their rows at once."""
    drafter, dev = ps[0].drafter, ps[0].target.device
    h_all, contexts, depths = _ingest_batch(ps, tokens, max_tokens)
    drafted: list[list[int]] = [[] for _ in ps]
    probs: list[list[torch.Tensor]] = [[] for _ in ps]
    active = [j for j, k in enumerate(depths) if k > 0]
    h = h_all[active]
    try:
        for i in range(max(depths, default=0)):
            if not active:
                break
            normed = drafter.norm(h)
            static = ps[0].vocab.static_logits(normed)
            greedy = [row for row, j in enumerate(active) if ps[j].sampling is None or ps[j].sampling.greedy]
            whole = len(greedy) == len(active)
            tops = dict(zip(greedy, greedy_tops([ps[active[row]].vocab for row in greedy],
                                                normed if whole else normed[greedy],
                                                static if whole else static[greedy]))) if greedy else {}
            going, next_tokens = [], []
            for row, j in enumerate(active):
                p = ps[j]
                if row in tops:
                    local, top = tops[row]
                    token, goes_on = p.vocab.target_id(local), top >= p.options.confidence_threshold
                else:
                    logits = p.vocab.logits(normed[row : row + 1], static_logits=static[row : row + 1])[0]
                    token, q = p._pick(logits)
                    if q is not None:
                        probs[j].append(q)
                    goes_on = keeps_drafting(p.options.confidence_threshold, logits, q, token)
                drafted[j].append(token)
                if i < depths[j] - 1 and goes_on:
                    going.append(row)
                    next_tokens.append(token)
            if not going:
                break
            active = [active[row] for row in going]
            h = drafter.step_batch(h[going], torch.tensor(next_tokens, device=dev),
                                   torch.tensor([contexts[j] + i for j in active], device=dev),
                                   [ps[j].cache for j in active], [1] * len(active))  # type: ignore[misc]
    finally:
        for p, c in zip(ps, contexts):
            p.cache.truncate(c)  # type: ignore[union-attr]
    return [Draft(tokens=d, probs=torch.stack(q) if q else None) for d, q in zip(drafted, probs)]


def _ingest_batch(ps: Sequence[Eagle3Proposer], tokens: Sequence[Sequence[int]],
                  max_tokens: Sequence[int]) -> tuple[torch.Tensor, list[int], list[int]]:
    """Reads every proposer's pending committed positions (after `catch_up_batch`, at most CATCH_UP_ROWS
    each) in one drafter step; then each follows its tokens. Returns each sequence's last ingested output [n, H], its drafter context and its draft depth."""
    Eagle3Proposer.catch_up_batch(ps, tokens)
    inputs = [p._ingest_inputs(t) for p, t in zip(ps, tokens)]
    out = _step_batch(ps, inputs)
    ends = torch.tensor([x[0].shape[0] for x in inputs]).cumsum(0) - 1
    for p, t in zip(ps, tokens):
        p.vocab.follow(t)
    contexts = [p.cache.length for p in ps]  # type: ignore[union-attr]
    depths = [min(p.options.num_speculative_tokens, m) for p, m in zip(ps, max_tokens)]
    return out[ends.to(out.device)], contexts, depths


def _step_batch(ps: Sequence[Eagle3Proposer], inputs: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]
                ) -> torch.Tensor:
    """One drafter step over the `_ingest_inputs` of proposers sharing a drafter; their output rows [sum n, H]."""
    drafter = ps[0].drafter
    return drafter.step_batch(drafter.fuse(torch.cat([x[0] for x in inputs])), torch.cat([x[1] for x in inputs]),
                              torch.cat([x[2] for x in inputs]), [p.cache for p in ps], [x[3] for x in inputs])  # type: ignore[misc]


def _vocab_logits(ps: Sequence[Eagle3Proposer], h: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
    """Each sequence's draft logits [counts[j], V_j] over its rows of drafter outputs h (the sequences' rows
    one after another): one norm and one static-vocabulary head call for all rows, each row with the bits
    of the row's `vocab.logits` on its own."""
    vocab = ps[0].vocab
    normed = ps[0].drafter.norm(h)
    static = vocab.static_logits(normed)
    out, start = [], 0
    for p, n in zip(ps, counts):
        out.append(p.vocab.logits(normed[start : start + n], static_logits=static[start : start + n]))
        start += n
    return out


@torch.inference_mode()
def _tree_batch(ps: Sequence[Eagle3Proposer], tokens: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[Draft]:
    """`Eagle3Proposer.propose` for tree proposers sharing one drafter: one ingest step, then `_trees`."""
    h_all, contexts, depths = _ingest_batch(ps, tokens, max_tokens)
    growing = [j for j, d in enumerate(depths) if d > 0]
    drafts = [Draft(tokens=[]) for _ in ps]
    if growing:
        grown = _trees([ps[j] for j in growing], h_all[growing], [contexts[j] for j in growing],
                       [depths[j] for j in growing])
        for j, d in zip(growing, grown):
            drafts[j] = d
    return drafts


@torch.inference_mode()
def _trees(ps: Sequence[Eagle3Proposer], h_roots: torch.Tensor, contexts: Sequence[int],
           depths: Sequence[int]) -> list[Draft]:
    """EAGLE-2 dynamic trees (dynamic_tree.tree_growth) of sequences sharing one drafter, grown level by level
    together: one drafter step for every sequence's frontier per level, every frontier's draft-vocabulary
    rows in one head call. h_roots [n, H]: each sequence's last ingested output. Each tree is the one the
    sequence grows alone (row-invariant linears, attention per sequence over its own cache)."""
    drafter, dev = ps[0].drafter, ps[0].target.device
    slots: list[dict[int, int]] = [{} for _ in ps]  # node index -> its drafter cache entry
    hidden: list[dict[int, torch.Tensor]] = [{} for _ in ps]  # node index -> drafter output after feeding it
    trees = TreesInStep([
        tree_growth(torch.log_softmax(root[0], dim=-1).cpu(), p.options.tree_top_k, depth,
                    p.options.tree_num_draft_tokens, min_score(p.options.confidence_threshold))
        for p, root, depth in zip(ps, _vocab_logits(ps, h_roots, [1] * len(ps)), depths)])
    requests = trees.requests
    try:
        while requests:
            members = sorted(requests)
            h_in, toks, positions, visibles, starts = [], [], [], [], []
            for j in members:
                frontier, nodes = requests[j]
                start, n, context = ps[j].cache.length, len(frontier), contexts[j]  # type: ignore[union-attr]
                listed = []
                for row, i in enumerate(frontier):  # each node sees the context, its ancestors and itself
                    entries = [start + row]
                    a = nodes[i].parent
                    while a != -1:
                        entries.append(slots[j][a])
                        a = nodes[a].parent
                    listed.append(sorted(entries))
                visible = ListedVisibility(context, listed)
                h_in += [hidden[j][nodes[i].parent] if nodes[i].parent != -1 else h_roots[j : j + 1] for i in frontier]
                toks.append(ps[j]._to_target(torch.tensor([nodes[i].token for i in frontier], device=dev)))
                positions += [context + nodes[i].depth - 1 for i in frontier]
                visibles.append(visible)
                starts.append(start)
            out = drafter.step_batch(torch.cat(h_in), torch.cat(toks), torch.tensor(positions, device=dev),
                                     [ps[j].cache for j in members], visibles)  # type: ignore[misc]
            counts = [v.rows for v in visibles]
            row0 = 0
            for j, start, n, logits in zip(members, starts, counts, _vocab_logits([ps[j] for j in members], out, counts)):
                for row, i in enumerate(requests[j][0]):
                    slots[j][i] = start + row
                    hidden[j][i] = out[row0 + row : row0 + row + 1]
                row0 += n
                trees.feed(j, torch.log_softmax(logits, dim=-1).cpu())
    finally:
        for p, c in zip(ps, contexts):
            p.cache.truncate(c)  # type: ignore[union-attr]
    drafts = []
    for p, nodes in zip(ps, trees.selected):
        ids = p._to_target(torch.tensor([n.token for n in nodes], device=dev)).tolist()
        drafts.append(Draft(tokens=[int(t) for t in ids], parents=[n.parent for n in nodes]))
    return drafts
