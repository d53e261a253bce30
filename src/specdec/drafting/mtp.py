"""MTP drafting: `{"method": "mtp"}` uses the MTP layers of the target's own checkpoint, `{"method":
"mtp", "model": DIR}` a drafter trained with `specdec train mtp`; `num_speculative_tokens` chained steps,
or with `tree_top_k` > 1 a dynamic tree that deep (mtp_tree.py).

Every depth k keeps its own KV cache, as in training, where depth k runs causally over its own positions.
With n + 1 committed tokens (positions 0..n) and the pending token t_{n+1}, depth k's entry at position i
needs t_{i+k}, so entries up to i = n + 1 - k are final and kept; the rest, up to i = n, read drafted
tokens and are dropped after the step. Draft d_k comes from depth k at position n. Depths beyond the
step's draft length catch up on the next step.

Depths 2 and deeper start their caches DEEP_CONTEXT positions before the end of the context they first see,
not at position 0: the module is one layer run once per depth, so reading a long prompt at every depth cost
six layers (a 1,500-token summary: 1.2 s of drafter reading beside the target's 2.9 s prefill). The shipped
drafter also drafted a little better so (held_out, a fixed chain: 2.53 -> 2.59 tokens a step, summaries 2.18 ->
2.40). Drafts are verified, so what the drafter attends over changes speed only, never the output.

`begin` reads the prompt t_0..t_n (no pending token yet) with the target's prefill: depth k's entries up
to i = n - k, all whose inputs are known (`MTPState.read`). So the first draft, like every later one, runs
only the positions since the last step (k entries at depth k): the auto draft-length policy charges a
step's time to the tokens drafted in it, and a long prompt read in a draft would stall every other stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specdec.drafting.base import Draft, Proposer
from specdec.drafting.confidence import keeps_drafting, threshold_problems
from specdec.drafting.context_vocab import ContextVocab
from specdec.drafting.drafter_format import shared_drafter
from specdec.drafting.int8_weights import AUTO, W8A8, mode_problems, uses_int8, with_int8_weights
from specdec.drafting.mtp_format import load_checkpoint_mtp, load_mtp
from specdec.drafting.mtp_model import MTPDrafter
from specdec.drafting.mtp_tree import draft_trees
from specdec.drafting.option_checks import draft_shape_problems
from specdec.drafting.registry import register
from specdec.drafting.shipped import resolve_drafter
from specdec.models.attention_mask import build_mask
from specdec.models.kv_cache import KVCache
from specdec.verification.probabilities import sample, sampling_probs

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel
    from specdec.models.runtime import ForwardResult
    from specdec.sampling_params import SamplingParams

# (depth, draft-vocab logits [Vd]) -> (target token id, q over the target vocab or None for a point mass)
Pick = Callable[[int, torch.Tensor], tuple[int, torch.Tensor | None]]

PROMPT_CHUNK = 512  # prompt positions a depth's block reads per call at begin() (no prompt x prompt scores)
# positions before the end of the context that depths >= 2 start their caches at (None: position 0)
DEEP_CONTEXT: int | None = 256


class MTPState:
    """One request's MTP state: target final hidden states of committed positions, and per depth its
    KV cache and its final outputs (the next depth's inputs)."""

    def __init__(self, drafter: MTPDrafter, depths: int, capacity: int, vocab: ContextVocab | None = None) -> None:
        """vocab: the request's draft vocabulary with its context tokens; None = the drafter's own."""
        a, dev, dtype = drafter.arch, drafter.d2t.device, drafter.target.dtype
        self.drafter, self.vocab, self.capacity = drafter, vocab, capacity
        self.features = torch.zeros(capacity, a.hidden_size, dtype=dtype, device=dev)
        self.length = 0  # committed positions whose target features arrived
        self.caches = [KVCache(1, a.num_kv_heads, a.head_dim, capacity, dtype, dev) for _ in range(depths)]
        self.outputs = [torch.zeros(capacity, a.hidden_size, dtype=dtype, device=dev) for _ in range(depths)]
        self.first_positions: list[int | None] = [0] + [None] * (depths - 1)  # per depth; None: not started
        self.last_logits: list[torch.Tensor] = []  # per depth of the last draft (tests)

    def add(self, final_hidden: torch.Tensor) -> None:
        n = final_hidden.shape[0]
        if self.length + n > self.capacity:
            raise RuntimeError(f"MTP state full ({self.capacity} positions)")
        self.features[self.length : self.length + n] = final_hidden
        self.length += n

    def next_position(self, depth: int) -> int:
        """The position of depth's next cache entry: its first one (depths >= 2 start DEEP_CONTEXT positions
        before the end of the context they first see, fixed then) plus the entries it holds."""
        first = self.first_positions[depth - 1]
        if first is None:
            first = 0 if DEEP_CONTEXT is None else max(self.length - DEEP_CONTEXT, 0)
            self.first_positions[depth - 1] = first
        return first + self.caches[depth - 1].length

    def logits(self, depth: int, h: torch.Tensor) -> torch.Tensor:
        """Depth's logits [n, vocab] of outputs h [n, H]: the request's vocabulary, or the drafter's own."""
        module = self.drafter.module_for(depth)
        if self.vocab is None:
            return self.drafter.logits(module, h)
        return self.vocab.logits(module.norm(h, module.shared_norm))

    def to_target(self, local: torch.Tensor) -> torch.Tensor:
        """Target ids of vocabulary indices (the request's vocabulary, or the drafter's own)."""
        return self.drafter.draft_to_target(local) if self.vocab is None else self.vocab.to_target(local)

    def run(self, depth: int, x: torch.Tensor, start: int, ancestry: torch.Tensor | None = None,
            positions: torch.Tensor | None = None) -> torch.Tensor:
        """Depth's block over new entries after its cache: by default a chain at positions start.., else
        at `positions`, each row seeing the new rows `ancestry` [m, m] marks (mtp_tree.py)."""
        mask, cos, sin, positions = self.reserve(depth, x.shape[0], start, ancestry, positions)
        return self.drafter.module_for(depth).block(x, cos, sin, mask, self.caches[depth - 1], positions=positions)

    def reserve(self, depth: int, m: int, start: int, ancestry: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Claims m new entries in depth's cache (see `run`); returns their additive mask, cos, sin and
        positions for the block."""
        d, cache = self.drafter, self.caches[depth - 1]
        block = d.module_for(depth).block
        dev = self.features.device
        if positions is None:
            positions = torch.arange(start, start + m, device=dev)
        cache.reserve(m, positions)
        if ancestry is None:
            ancestry = torch.ones(m, m, dtype=torch.bool, device=dev).tril_()
        allowed = build_mask(cache.positions, cache.length, ancestry, positions, block.window)
        zero = torch.zeros((), dtype=torch.float32, device=dev)
        mask = torch.where(allowed, zero, float("-inf")).repeat(d.arch.num_heads // d.arch.num_kv_heads, 1)
        cos, sin = d.rope(positions, self.capacity)
        return mask, cos, sin, positions

    def entry_inputs(self, depth: int, seq: Sequence[int], start: int, end: int,
                     drafted: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth's inputs for its entries at positions [start, end): token ids [m] (t_{i+depth} of `seq`) and
        the previous depth's outputs [m, H] (depth 1: the target's features), its kept ones, then `drafted`,
        its outputs at the last positions, which read drafted tokens. The block's rows are
        `module_for(depth).project(drafter.embed(ids), hidden)`."""
        source = self.features if depth == 1 else self.outputs[depth - 2]
        kept = end - (0 if drafted is None else drafted.shape[0])  # the kept outputs read end here
        hidden = source[start:kept] if drafted is None else torch.cat([source[start:kept], drafted])
        ids = torch.tensor(seq[start + depth : end + depth], dtype=torch.long, device=self.features.device)
        return ids, hidden

    def keep(self, depth: int, out: torch.Tensor, start: int, final: int) -> None:
        """Keeps the entries [start, final) of depth's block run from position `start` (outputs `out`):
        its cache entries and its outputs, the next depth's inputs; the rest are dropped."""
        self.caches[depth - 1].commit(range(final - start))
        self.outputs[depth - 1][start:final] = out[: final - start]

    @torch.inference_mode()
    def read(self, tokens: Sequence[int]) -> None:
        """Fills every depth's cache from committed tokens alone: `tokens` are those of the positions whose
        features arrived (no pending token), so depth k's entries up to position len(tokens) - 1 - k, the
        ones whose t_{i+k} is known; the last k wait for the next draft, which reads the pending token.
        In chunks of PROMPT_CHUNK positions: a long prompt in one call would need a prompt x prompt score
        matrix. Attention is per row over the cache (fixed capacity, masked) and the linears are
        row-invariant, so the entries are bit-identical to those a draft computes."""
        if self.length != len(tokens):
            raise RuntimeError(f"MTP state out of step: features of {self.length} positions, {len(tokens)} tokens")
        d, chunk = self.drafter, PROMPT_CHUNK
        for k in range(1, len(self.caches) + 1):
            module, final = d.module_for(k), max(len(tokens) - k, 0)
            for start in range(self.next_position(k), final, chunk):
                end = min(final, start + chunk)
                ids, hidden = self.entry_inputs(k, tokens, start, end)
                self.keep(k, self.run(k, module.project(d.embed(ids), hidden), start), start, end)

    @torch.inference_mode()
    def draft(self, tokens: Sequence[int], depth: int, pick: Pick, threshold: float = 0.0) -> Draft:
        if self.length != len(tokens) - 1:
            raise RuntimeError(f"MTP state out of step: features of {self.length} positions, {len(tokens)} tokens")
        d = self.drafter
        seq, probs = list(tokens), []
        drafted: torch.Tensor | None = None  # the previous depth's outputs that read drafted tokens
        self.last_logits = []
        for k in range(1, min(depth, len(self.caches)) + 1):
            module = d.module_for(k)
            start, final = self.next_position(k), max(self.length + 1 - k, 0)  # entries [start, final) are kept
            ids, hidden = self.entry_inputs(k, seq, start, self.length, drafted)  # positions start..n
            out = self.run(k, module.project(d.embed(ids), hidden), start)
            self.keep(k, out, start, final)
            drafted = out[final - start :]
            logits = self.logits(k, out[-1:])[0]
            self.last_logits.append(logits)
            token, q = pick(k, logits)
            seq.append(token)
            if q is not None:
                probs.append(q)
            if not keeps_drafting(threshold, logits, q, token):
                break  # deeper caches catch up on a later draft
        drafted = seq[len(tokens) :]
        return Draft(tokens=drafted, probs=torch.stack(probs) if probs else None)

    @torch.inference_mode()
    def draft_tree(self, tokens: Sequence[int], depth: int, top_k: int, total: int, threshold: float) -> Draft:
        """A dynamic tree (mtp_tree.py) of point-mass nodes: top-k children, the `total` likeliest kept;
        growth stops once no frontier path is likelier than `threshold`."""
        return draft_trees([self], [tokens], [depth], top_k, total, threshold)[0]


@dataclass
class MTPOptions:
    model: str | None = None  # a trained MTP drafter; None: the MTP layers of the target's checkpoint
    num_speculative_tokens: int = 3  # chain length; the tree's depth when tree_top_k > 1
    tree_top_k: int = 1  # children per expanded node (SGLang --speculative-eagle-topk); 1 = chain
    tree_num_draft_tokens: int = 16  # nodes kept after reranking (SGLang --speculative-num-draft-tokens)
    # chains: stop after a token drafted with less probability (confidence.py); trees: stop growing once
    # no frontier path is that likely
    confidence_threshold: float = 0.0
    # also propose the request's context tokens outside the draft vocabulary (context_vocab.py)
    context_vocab: bool = True
    # the blocks' linears and head rows on int8 copies, as EAGLE-3's (int8_weights.py): "auto", "w8a8_int8",
    # or "none" / null
    quantization: str | None = AUTO

    def problems(self) -> list[str]:
        out = threshold_problems(self.confidence_threshold) + mode_problems(self.quantization)
        return out + draft_shape_problems(self.num_speculative_tokens, self.tree_top_k, self.tree_num_draft_tokens)


@register("mtp")
class MTPProposer(Proposer):
    Options = MTPOptions

    def __init__(self, options: MTPOptions, target: LoadedModel) -> None:
        super().__init__(options, target)
        if target.decoder is None:
            raise ValueError("mtp needs the target's hidden states, which only the native runtime provides")
        path = None if options.model is None else resolve_drafter(options.model)
        int8 = uses_int8(options.quantization, target.device)

        def build() -> MTPDrafter:
            drafter = load_checkpoint_mtp(target) if path is None else load_mtp(path, target)[0]
            drafter = drafter.to(device=target.device, dtype=target.dtype).eval()
            drafter.attach_target(target.decoder)
            return with_int8_weights(drafter.prepare(), options.quantization, int8)

        self.drafter = shared_drafter(target, "mtp", path, build, variant=W8A8 if int8 else "")
        assert self.drafter._target is not None
        self.vocab = ContextVocab(self.drafter.draft_ids(), self.drafter._target[1], target.decoder.head_weight(),
                                  softcap=target.decoder.arch.final_logit_softcap, enabled=options.context_vocab)
        if self.drafter.int8_head is not None:
            self.vocab.static_weight = self.drafter.int8_head
        self.state: MTPState | None = None
        self.sampling: SamplingParams | None = None
        self.generator: torch.Generator | None = None

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, generator: torch.Generator | None,
              capacity: int, prefill: ForwardResult | None = None) -> None:
        if prefill is None or prefill.final_hidden is None:
            raise ValueError("mtp needs the target's prefill forward")
        # room for the draft entries a step runs past the committed ones (a tree's: every node on its paths)
        room = self.options.num_speculative_tokens * (self.options.tree_top_k + 1) + 8
        self.state = MTPState(self.drafter, self.options.num_speculative_tokens, capacity + room, self.vocab)
        self.vocab.start(prompt)
        self.state.add(prefill.final_hidden)
        self.state.read(prompt)  # the prompt's entries now, with the prefill, not in the first draft
        self.sampling, self.generator = sampling, generator

    def _pick(self, depth: int, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        s = self.sampling
        if s is None or s.greedy:
            return int(self.vocab.to_target(logits.argmax())), None
        full = logits.new_full((self.target.vocab_size,), float("-inf"))
        full[self.vocab.to_target(torch.arange(logits.numel(), device=logits.device))] = logits
        q = sampling_probs(full[None], s.temperature, s.top_k, s.top_p)[0]
        return sample(q, self.generator), q

    @classmethod
    def propose_batch(cls, proposers: Sequence[Proposer], tokens: Sequence[Sequence[int]],
                      max_tokens: Sequence[int]) -> list[Draft]:
        """Drafts of the sequences that share a drafter: each depth's block runs once for all of them per
        drafted position (chains, mtp_batch.py) or tree level (trees, mtp_tree.py), every draft the one
        `propose` gives."""
        from specdec.drafting.mtp_batch import draft_chains

        out: list[Draft | None] = [None] * len(proposers)
        chains: dict[int, list[int]] = {}
        trees: dict[tuple[int, int, int, float], list[int]] = {}
        for i, p in enumerate(proposers):
            if not isinstance(p, MTPProposer):
                raise TypeError("propose_batch takes mtp proposers only")
            o = p.options
            if o.tree_top_k > 1 and min(o.num_speculative_tokens, max_tokens[i]) > 0:
                key = (id(p.drafter), o.tree_top_k, o.tree_num_draft_tokens, o.confidence_threshold)
                trees.setdefault(key, []).append(i)
            elif o.tree_top_k > 1:
                out[i] = p.propose(tokens[i], max_tokens[i])
            else:
                chains.setdefault(id(p.drafter), []).append(i)
        for (_, top_k, total, threshold), members in trees.items():
            ps = [proposers[i] for i in members]
            for p, i in zip(ps, members):
                p.vocab.follow(tokens[i])  # type: ignore[attr-defined]
            drafts = draft_trees([p.state for p in ps], [tokens[i] for i in members],  # type: ignore[attr-defined]
                                 [min(p.options.num_speculative_tokens, max_tokens[i]) for p, i in zip(ps, members)],  # type: ignore[attr-defined]
                                 top_k, total, threshold)
            for i, d in zip(members, drafts):
                out[i] = d
        for members in chains.values():
            ps = [proposers[i] for i in members]
            for p, i in zip(ps, members):
                p.vocab.follow(tokens[i])  # type: ignore[attr-defined]
            drafts = draft_chains(
                [p.state for p in ps],  # type: ignore[attr-defined]
                [tokens[i] for i in members],
                [min(p.options.num_speculative_tokens, max_tokens[i]) for p, i in zip(ps, members)],  # type: ignore[attr-defined]
                [p._pick for p in ps], [p.options.confidence_threshold for p in ps])  # type: ignore[attr-defined]
            for i, d in zip(members, drafts):
                out[i] = d
        return [d for d in out if d is not None]

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        assert self.state is not None
        self.vocab.follow(tokens)
        o = self.options
        depth = min(o.num_speculative_tokens, max_tokens)
        if o.tree_top_k > 1 and depth > 0:
            return self.state.draft_tree(tokens, depth, o.tree_top_k, o.tree_num_draft_tokens,
                                         o.confidence_threshold)
        return self.state.draft(tokens, depth, self._pick, o.confidence_threshold)

    def feedback(self, num_accepted: int, verified: ForwardResult | None = None,
                 path: Sequence[int] | None = None) -> None:
        if verified is None or verified.final_hidden is None or self.state is None:
            raise RuntimeError("mtp needs the verification forward's final hidden states")
        kept = [0, *(i + 1 for i in path)] if path is not None else list(range(num_accepted + 1))
        self.state.add(verified.final_hidden[kept])
