"""DFlash's training objective: many anchored blocks of one sequence in one forward.

Anchors are response positions (at inference the anchor is always a token the target produced). Block j
is [ids[a_j], MASK x (B-1)] at positions a_j .. a_j + B - 1; it sees the context features of positions
< a_j and its own block (`context_visibility` + `attend`'s block-diagonal), so one forward trains all the
blocks independently. Slot i predicts ids[a_j + i], scored against the target's distribution at position
a_j + i - 1 restricted to the draft vocabulary, when that token is in the sequence and in the draft vocab;
slot i's loss weight is exp(-(i - 1) / gamma) (speculators' `dflash_loss_decay`), since a slot only
counts when every slot before it was accepted. With a `context_head`, the sample's tokens outside the draft
vocabulary that appeared up to the anchor join it, as `context_vocab` drafts at inference (context_columns.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.drafting.dflash_model import DFlashConfig, DFlashDrafter, context_visibility
from specdec.models.loading import LoadedModel
from specdec.training.context_columns import context_columns
from specdec.training.eagle3_objective import default_aux_layers
from specdec.training.trainer import StepMetrics
from specdec.training.features import SampleFeatures


def default_target_layer_ids(num_layers: int, count: int = 3) -> list[int]:
    """`count` target layers spread over the depth, in DFlash's convention (their outputs: runtime
    hidden[id + 1]). Three: the outputs of layers 1, L/2 - 1 and L - 4, which are exactly the residual
    streams EAGLE-3 reads (entering 2, L/2, L - 3), so both trainings share one feature cache (Gemma 3
    270M: 1, 8, 14). Other counts: DFlash's uniform spread over the outputs of layers 1 .. L - 3."""
    if count == 3:
        ids = [i - 1 for i in default_aux_layers(num_layers)]
    else:
        start, end = 1, max(num_layers - 3, 1)
        ids = [round(start + i * (end - start) / max(count - 1, 1)) for i in range(count)]
    return sorted({min(max(i, 0), num_layers - 1) for i in ids})


def default_mask_token_id(target: LoadedModel) -> int:
    """A token the target's embedding holds that the drafter can learn to read as 'to be predicted':
    the tokenizer's mask token (Gemma: <mask>), else pad, else unk, else 0."""
    tok = target.tokenizer
    for name in ("mask_token_id", "pad_token_id", "unk_token_id"):
        value = getattr(tok, name, None)
        if isinstance(value, int) and 0 <= value < target.vocab_size:
            return value
    return 0


def default_dflash_config(target: LoadedModel, draft_vocab_size: int, block_size: int = 16, num_layers: int = 3,
                          aux_layers: list[int] | None = None, mask_token_id: int | None = None) -> DFlashConfig:
    """Draft layers as wide as the target (its hidden, MLP, heads and KV heads)."""
    text = target.config.get_text_config()
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    if aux_layers is None:
        aux_layers = default_target_layer_ids(int(text.num_hidden_layers))
    return DFlashConfig(
        hidden_size=hidden,
        intermediate_size=int(text.intermediate_size),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        num_hidden_layers=num_layers,
        vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=hidden,
        block_size=block_size,
        mask_token_id=default_mask_token_id(target) if mask_token_id is None else mask_token_id,
        aux_layer_ids=list(aux_layers),
        rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
    )


def default_gamma(block_size: int) -> float:
    """The decay length of the loss weights: 7 for B = 16, 4 for B = 8 (DFlash / speculators)."""
    return 4.0 if block_size <= 8 else 7.0


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B] loss weight per block slot: 0 for the anchor slot, exp(-(i - 1) / gamma) for slot i >= 1."""
    i = torch.arange(block_size, dtype=torch.float32)
    return torch.where(i > 0, torch.exp(-(i - 1) / gamma), torch.zeros(()))


def sample_anchors(prompt_len: int, seq_len: int, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """Up to `count` distinct anchor positions, ascending, among the response positions that have a next
    token (prompt_len .. seq_len - 2); pass prompt_len 1 to draw from the prompt too (position 0 has no
    context to read)."""
    candidates = torch.arange(max(prompt_len, 1), seq_len - 1)
    if candidates.numel() > count:
        candidates = candidates[torch.randperm(candidates.numel(), generator=generator)[:count]].sort().values
    return candidates


def dflash_loss(drafter: DFlashDrafter, ids: torch.Tensor, feats: SampleFeatures, anchors: torch.Tensor,
                t2d_index: torch.Tensor, gamma: float, prompt_len: int = 0,
                context_head: torch.Tensor | None = None) -> tuple[torch.Tensor, StepMetrics]:
    """Loss of the blocks anchored at `anchors` [A] in the sequence `ids` [T], target-written from
    `prompt_len` on; a slot on a prompt token is labelled with the target's most likely draft token there
    (training/labels.py), so anchors may sit in the prompt too (`--prompt-samples`). Metrics per slot i = 1..B-1: `counted` = blocks whose slots 1..i-1 all matched the
    target's greedy token and whose slot i is scored, `correct` = those whose slot i matched too; so
    correct/counted is the conditional acceptance rate of slot i, and 1 + sum of their running products
    the expected tokens per step of a greedy chain (`estimated_acceptance_length`). `context_head` (the
    target's whole LM head) adds context columns: every slot of block j drafts after the context
    ids[: a_j + 1], the anchor included, so a token seen there is proposable."""
    c = drafter.config
    b, t, dev = c.block_size, ids.shape[0], feats.final_hidden.device
    ids, anchors, t2d_index = ids.to(dev), anchors.to(dev), t2d_index.to(dev)
    ctx = drafter.context(torch.cat([feats.hidden[i] for i in c.runtime_layers], dim=-1).float())
    kv = drafter.context_kv(ctx, torch.arange(t, device=dev))
    positions = anchors[:, None] + torch.arange(b, device=dev)[None, :]  # [A, B]
    h = drafter.blocks(drafter.block_tokens(ids[anchors]), positions, kv, context_visibility(anchors, t))
    labels = torch.full((anchors.numel(), b), -1, dtype=torch.long, device=dev)
    inside = positions < t
    labels[inside] = t2d_index[ids[positions[inside]]]
    in_prompt = inside & (positions < prompt_len)
    if in_prompt.any():
        with torch.no_grad():
            labels[in_prompt] = drafter.draft_logits_from_normed(feats.final_hidden[positions[in_prompt] - 1]).argmax(-1)
    extra = context_columns(ids, t2d_index, context_head) if context_head is not None else None
    context_end = anchors[:, None].expand_as(positions)  # [A, B] last position the block's drafts have seen
    if extra is not None:  # a response token outside the static vocabulary scores its column once seen
        labels[inside] = extra.labels(ids[positions[inside]], labels[inside], context_end[inside])
    labels[:, 0] = -1  # the anchor slot is the pending token itself, never a draft
    scored = labels >= 0
    weights = position_weights(b, gamma).to(dev)[None, :].expand_as(labels)[scored]
    with torch.no_grad():  # the target's distribution for the token at p, from its state at p - 1
        target_normed = feats.final_hidden[positions[scored] - 1]
        target_logits = drafter.draft_logits_from_normed(target_normed)
        if extra is not None:
            target_logits = extra.extend(target_logits, target_normed, context_end[scored])
        target_p = torch.softmax(target_logits, dim=-1)
    if extra is None:
        logits = drafter.draft_logits(h[scored])  # the LM head on scored rows only (most of the cost)
    else:
        normed = drafter.norm(h[scored])
        logits = extra.extend(drafter.draft_logits_from_normed(normed), normed, context_end[scored])
    if weights.numel():
        ce = -(target_p * F.log_softmax(logits, dim=-1)).sum(-1)
        loss = (weights * ce).sum() / weights.sum()
    else:  # no scored slot: keep the graph so the trainer's backward works
        loss = sum((p.sum() * 0.0 for p in drafter.parameters() if p.requires_grad), torch.zeros((), device=dev))
    hit = torch.zeros_like(labels, dtype=torch.bool)
    hit[scored] = logits.argmax(-1) == labels[scored]
    prefix = torch.cumprod(hit[:, 1:].int(), dim=1).bool()  # [A, B-1]: slots 1..i all right
    alive = torch.cat([torch.ones_like(prefix[:, :1]), prefix[:, :-1]], dim=1)  # slots 1..i-1 all right
    counted = (alive & scored[:, 1:]).sum(0).tolist()
    correct = prefix.sum(0).tolist()
    chain = [(i - 1, anchors + i - 1, hit[:, i]) for i in range(1, b)]  # slot i drafts after a_j + i - 1
    return loss, StepMetrics(float(loss.detach()), correct, counted, chain_hits=chain)
