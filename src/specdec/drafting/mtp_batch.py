"""MTP chains of many sequences at once: each depth's block runs once over every sequence's new entries.

The same steps as `MTPState.draft` (mtp.py), sequence by sequence in the bookkeeping and batched in the
arithmetic: the projection and the block's linears over all rows in one call each (row-invariant in bfloat16
on CPU), attention per sequence over its own depth cache, the draft vocabulary's logits of every sequence in
one call. So every sequence's draft is the one `MTPState.draft` gives it alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafting.base import Draft
from specdec.drafting.confidence import keeps_drafting
from specdec.models.decoder import SequenceRows

from specdec.drafting.mtp import MTPState, Pick


@torch.inference_mode()
def draft_chains(states: Sequence[MTPState], tokens: Sequence[Sequence[int]], depths: Sequence[int],
                 picks: Sequence[Pick], thresholds: Sequence[float]) -> list[Draft]:
    """`states[i].draft(tokens[i], depths[i], picks[i], thresholds[i])` for every i; the states share one
    drafter and each has its request's context vocabulary."""
    d = states[0].drafter
    for st, t in zip(states, tokens):
        if st.length != len(t) - 1:
            raise RuntimeError(f"MTP state out of step: features of {st.length} positions, {len(t)} tokens")
        st.last_logits = []
    seqs = [list(t) for t in tokens]
    probs: list[list[torch.Tensor]] = [[] for _ in states]
    drafted: list[torch.Tensor | None] = [None for _ in states]  # the previous depth's outputs of drafted tokens
    active = [j for j, st in enumerate(states) if min(depths[j], len(st.caches)) >= 1]
    k = 1
    while active:
        module = d.module_for(k)
        parts, ids, finals, starts = [], [], [], []
        for j in active:
            st = states[j]
            start, final = st.next_position(k), max(st.length + 1 - k, 0)  # entries [start, final) are kept
            i, part = st.entry_inputs(k, seqs[j], start, st.length, drafted[j])  # positions start..n
            parts.append(part)
            ids.append(i)
            starts.append(start)
            finals.append(final)
        x = module.project(d.embed(torch.cat(ids)), torch.cat(parts))
        cos, sin, positions, sequences, row = [], [], [], [], 0
        for j, part, start in zip(active, parts, starts):
            m = part.shape[0]
            mask, c, s, p = states[j].reserve(k, m, start)
            cos.append(c)
            sin.append(s)
            positions.append(p)
            sequences.append(SequenceRows(row, row + m, states[j].caches[k - 1], {module.block.window: mask}))
            row += m
        out = module.block.forward_batch(x, torch.cat(cos), torch.cat(sin), sequences, torch.cat(positions))
        lasts = []
        for j, seq_rows, start, final in zip(active, sequences, starts, finals):
            h = out[seq_rows.start : seq_rows.end]
            states[j].keep(k, h, start, final)
            drafted[j] = h[final - start :]
            lasts.append(h[-1:])
        normed = module.norm(torch.cat(lasts), module.shared_norm)
        vocab0 = states[0].vocab
        assert vocab0 is not None
        static = vocab0.static_logits(normed)
        going = []
        for r, j in enumerate(active):
            st = states[j]
            assert st.vocab is not None
            logits = st.vocab.logits(normed[r : r + 1], static_logits=static[r : r + 1])[0]
            st.last_logits.append(logits)
            token, q = picks[j](k, logits)
            seqs[j].append(token)
            if q is not None:
                probs[j].append(q)
            if k < min(depths[j], len(st.caches)) and keeps_drafting(thresholds[j], logits, q, token):
                going.append(j)  # deeper caches of the others catch up on a later draft
        active, k = going, k + 1
    return [Draft(tokens=s[len(t):], probs=torch.stack(p) if p else None) for s, t, p in zip(seqs, tokens, probs)]
