"""EAGLE-3's training objective: training-time test (TTT) unrolled over several draft steps.

Step 0 reads the fused target features; step j reads step j-1's outputs, with tokens and targets shifted
one more position (index t at step j stands for sequence position t + j). The loss at each step is the
cross-entropy against the target's distribution restricted to the draft vocabulary, on response positions
whose token (the target's greedy choice) is in that vocabulary, weighted by decay**j. With a
`context_head`, the sample's tokens seen so far join that vocabulary, as at inference (context_columns.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from specdec.drafting.eagle3_model import Eagle3Config, Eagle3Drafter
from specdec.models.loading import LoadedModel
from specdec.training.context_columns import context_columns
from specdec.training.features import SampleFeatures
from specdec.training.labels import targets_and_labels
from specdec.training.trainer import StepMetrics


def default_aux_layers(num_layers: int) -> list[int]:
    """Residual stream entering layers 2, L/2 and L-3 (EAGLE-3 and speculators), deduplicated for tiny models."""
    wanted = [2, num_layers // 2, num_layers - 3]
    return sorted({min(max(i, 0), num_layers) for i in wanted})


def default_eagle3_config(target: LoadedModel, draft_vocab_size: int, aux_layers: Sequence[int] | None = None) -> Eagle3Config:
    text = target.config.get_text_config()
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    return Eagle3Config(
        hidden_size=hidden,
        intermediate_size=int(text.intermediate_size),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=hidden,
        aux_layer_ids=list(aux_layers) if aux_layers is not None else default_aux_layers(int(text.num_hidden_layers)),
        rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
    )


def ttt_loss(drafter: Eagle3Drafter, ids: torch.Tensor, prompt_len: int, feats: SampleFeatures, steps: int,
             decay: float, t2d_index: torch.Tensor, noise_std: float = 0.0,
             score_prompt: bool = False, context_head: torch.Tensor | None = None, window: int | None = None,
             hits: list[tuple[int, torch.Tensor, torch.Tensor]] | None = None,
             skip_prompt_rows: bool = True) -> tuple[torch.Tensor, StepMetrics]:
    """Loss of one sequence `ids` [T] whose tokens from `prompt_len` on were written greedily by the target.

    Index t at step j reads token ids[t+1+j] and predicts ids[t+2+j]; it is scored when that token is a
    response token in the draft vocabulary, against the target's distribution at position t+1+j. Prompt
    positions serve as attention context only, unless `score_prompt`: then they are scored too, and since
    a prompt token is the corpus's and not the target's choice, their accuracy label is the target's most
    likely draft-vocabulary token. The LM head runs on scored rows only (it is most of the cost).

    `context_head` (the target's whole LM head) adds the sample's tokens outside the draft vocabulary as
    extra columns, each proposable once it has appeared before the draft's start (index t at any step
    drafts after the context ids[: t + 2]), for the drafter and the target's distribution alike.

    `window` limits the drafter's attention (eagle3_model.train_unrolled). `hits`, when given, receives
    (step j, the scored positions, whether each was right): accuracy against the position in the context.
    `skip_prompt_rows`: steps after the first skip the prompt indices no scored row needs (same result; a
    4k-token prompt with a 256-token response then costs one full step instead of `steps`).
    """
    c = drafter.config
    T = ids.shape[0]
    fused_in = torch.cat([feats.hidden[i] for i in c.aux_layer_ids], dim=-1).float()
    if noise_std:
        fused_in = fused_in + torch.randn_like(fused_in) * noise_std
    h = drafter.fuse(fused_in)
    first = 0 if score_prompt else max(prompt_len - 1, 0)  # positions whose next token is scored
    extra = context_columns(ids, t2d_index, context_head) if context_head is not None else None
    with torch.no_grad():  # the target's logits over the draft vocab at those positions
        target_logits = drafter.draft_logits_from_normed(feats.final_hidden[first : T - 1])
    past_k: list[torch.Tensor] = []
    past_v: list[torch.Tensor] = []
    total = torch.zeros((), dtype=torch.float32)
    correct, counted = [], []
    chain = []  # (step, position before the drafted token, right): hits, and validation's greedy walk
    # steps after the first only need the indices from the earliest scored one on (a long prompt's response)
    offset = max(first - steps, 0) if skip_prompt_rows else 0
    for j in range(steps):
        o = offset if j else 0  # step 0 takes every index (its keys are the context), later steps the offset's
        n = T - 1 - j - o  # index t needs the input token ids[t+1+j]
        if n <= 0:
            break
        # every step's output starts at index `offset` (step 0 runs its queries from there only)
        h = drafter.train_unrolled(h[:n], ids[1 + j + o : 1 + j + o + n], torch.arange(j + o, j + o + n),
                                   past_k, past_v, window, offset)
        lo, hi = max(first - 1 - j, 0), T - 2 - j  # scored indices t: first <= t+1+j <= T-2
        if hi <= lo:
            correct.append(0)
            counted.append(0)
            continue
        rows = torch.arange(lo, hi)
        at = rows + 1 + j  # the positions whose target distribution predicts the labels
        p, labels = targets_and_labels(target_logits[at - first], feats.final_hidden[at], ids, rows + 2 + j, rows + 1,
                                       prompt_len, t2d_index, extra, None, score_prompt)
        valid = labels >= 0
        rows, labels, p = rows[valid], labels[valid], p[valid]
        counted.append(int(rows.numel()))
        if not rows.numel():
            correct.append(0)
            continue
        if extra is None:
            logits = drafter.draft_logits(h[rows - offset])
        else:
            normed = drafter.norm(h[rows - offset])
            logits = extra.extend(drafter.draft_logits_from_normed(normed), normed, rows + 1)
        total = total + (decay**j) * -(p * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        right = logits.argmax(-1) == labels
        correct.append(int(right.sum()))
        chain.append((j, rows + 1 + j, right))
    if hits is not None:
        hits.extend(chain)
    return total, StepMetrics(float(total.detach()), correct, counted, chain_hits=chain)
