"""Training over the draft vocabulary plus the sample's tokens seen so far (training/context_columns.py)."""

from __future__ import annotations

import pytest
import torch
from specdec.drafting.context_vocab import ContextVocab
from specdec.drafting.medusa_model import MedusaConfig, MedusaHeads
from specdec.drafting.eagle3_model import Eagle3Drafter
from specdec.training.context_columns import BLOCKED, context_columns, context_coverage
from specdec.drafting.dflash_model import DFlashDrafter
from specdec.training.dflash_objective import default_dflash_config, dflash_loss, sample_anchors
from specdec.training.eagle3_objective import default_eagle3_config, ttt_loss
from specdec.training.features import FeatureExtractor
from specdec.training.medusa_objective import medusa_loss
from specdec.training.mtp_objective import mtp_loss

from mtp_helpers import random_mtp


def _index(vocab: int, static: list[int]) -> torch.Tensor:
    index = torch.full((vocab,), -1, dtype=torch.long)
    index[torch.tensor(static)] = torch.arange(len(static))
    return index


def test_a_column_opens_where_its_token_first_appears():
    index = _index(20, [0, 1, 2, 3, 4])
    ids = torch.tensor([1, 7, 2, 9, 7, 3, 9, 12])
    cols = context_columns(ids, index, torch.randn(20, 4))
    assert cols.ids.tolist() == [7, 9, 12] and cols.first.tolist() == [1, 3, 7] and cols.static_size == 5
    tokens = torch.tensor([7, 9, 12, 7, 2])
    ends = torch.tensor([0, 2, 6, 1, 0])  # the draft starts after ids[: end + 1]
    assert cols.labels(tokens, index[tokens], ends).tolist() == [-1, -1, -1, 5, 2]
    logits = cols.extend(torch.zeros(2, 5), torch.randn(2, 4), torch.tensor([0, 3]))
    assert logits.shape == (2, 8)
    assert (logits[0, 5:] == BLOCKED).all()
    assert (logits[1, 5:7] != BLOCKED).all() and logits[1, 7] == BLOCKED


def test_no_token_outside_the_vocabulary_adds_no_column():
    index = _index(10, list(range(10)))
    cols = context_columns(torch.tensor([1, 2, 3]), index, torch.randn(10, 4))
    assert cols.ids.numel() == 0
    labels = torch.tensor([1, 2])
    assert cols.labels(torch.tensor([1, 2]), labels, torch.tensor([0, 1])).tolist() == [1, 2]
    assert cols.extend(torch.zeros(2, 10), torch.randn(2, 4), torch.tensor([0, 1])).shape == (2, 10)


def test_coverage_counts_tokens_seen_before():
    index = _index(20, [0, 1, 2])
    assert context_coverage([([1, 7], [7, 9, 9, 2])], index.tolist()) == 0.75
    assert context_coverage([], index.tolist()) is None


def test_training_columns_are_the_tokens_inference_would_add():
    """Index t drafts after the committed context ids[: t + 2]; the columns open for it must be exactly
    the tokens ContextVocab holds at that moment (an off-by-one would teach copying tokens not yet seen)."""
    vocab, static = 30, [0, 1, 2, 3]
    head = torch.randn(vocab, 4)
    ids = torch.randint(0, vocab, (40,), generator=torch.Generator().manual_seed(0))
    cols = context_columns(ids, _index(vocab, static), head)
    prompt_len = 10
    inference = ContextVocab(torch.tensor(static), head[static], head)
    inference.start(ids[:prompt_len].tolist())
    for t in range(prompt_len - 2, len(ids) - 2):
        inference.follow(ids[: t + 2].tolist())
        seen = set(inference.to_target(torch.arange(len(inference))).tolist())
        open_cols = cols.ids[cols.allowed(torch.tensor([t + 1]))[0]].tolist()
        assert seen == set(static) | set(open_cols)


def test_ttt_loss_scores_copied_tokens_outside_the_vocabulary(zoo):
    """A response that repeats its prompt, over a draft vocabulary that lacks those tokens: the static
    objective scores none of the copies, the context one scores them all, with a finite loss and grads."""
    target = zoo.load("llama", "float32")
    torch.manual_seed(0)
    static = list(range(8))
    drafter = Eagle3Drafter(default_eagle3_config(target, len(static)))
    drafter.set_draft_vocab(torch.tensor(static))
    dec = target.decoder
    drafter.attach_target(dec.embed.weight, dec.head_weight(), dec.arch.embed_scale or 1.0)
    prompt = torch.randint(8, target.vocab_size, (12,), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([prompt, prompt])
    feats = FeatureExtractor(target, drafter.config.aux_layer_ids).compute(ids.tolist())
    index = drafter.target_to_draft()
    _, plain = ttt_loss(drafter, ids, 12, feats, 2, 0.8, index)
    loss, ctx = ttt_loss(drafter, ids, 12, feats, 2, 0.8, index, context_head=dec.head_weight())
    assert sum(plain.counted) == 0
    assert ctx.counted[0] == 12  # every copy ids[12..23]: each token was seen in the prompt
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in drafter.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def _mtp_or_medusa_on_a_repeated_prompt(zoo, method: str):
    """(target decoder, a random drafter over an 8-token draft vocabulary, ids, final hidden states): a
    12-token prompt of tokens outside that vocabulary, then the same 12 as the response."""
    target = zoo.load("llama", "float32")
    dec = target.decoder
    static = torch.arange(8)
    if method == "mtp":
        drafter = random_mtp(dec.arch, target.vocab_size, draft_ids=static)
        drafter.attach_target(dec)
    else:
        torch.manual_seed(0)
        drafter = MedusaHeads(MedusaConfig(dec.arch.hidden_size, 2, 1, target.vocab_size, 8, dec.arch.final_logit_softcap))
        drafter.set_draft_vocab(static)
        drafter.attach_target(dec.head_weight())
    prompt = torch.randint(8, target.vocab_size, (12,), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([prompt, prompt])
    return dec, drafter, ids, FeatureExtractor(target, [0]).compute(ids.tolist()).final_hidden


@pytest.mark.parametrize("method", ["mtp", "medusa"])
def test_mtp_and_medusa_losses_score_copied_tokens_too(zoo, method):
    dec, drafter, ids, final = _mtp_or_medusa_on_a_repeated_prompt(zoo, method)
    index = drafter.target_to_draft()

    def loss(head):
        if method == "mtp":
            return mtp_loss(drafter, ids, 12, final, [0.6, 0.4], index, context_head=head)
        return medusa_loss(drafter, ids, 12, final, 0.8, index, context_head=head)

    _, plain = loss(None)
    value, ctx = loss(dec.head_weight())
    assert sum(plain.counted) == 0
    assert ctx.counted[0] == 12
    assert torch.isfinite(value)
    value.backward()
    assert all(torch.isfinite(p.grad).all() for p in drafter.parameters() if p.grad is not None)


@pytest.mark.parametrize("method", ["mtp", "medusa"])
def test_mtp_and_medusa_hits_agree_with_their_step_metrics(zoo, method):
    """`hits` (accuracy by position, scripts/accuracy_by_position.py) holds exactly the scored rows: per
    draft step as many as counted, as many right as correct, each at the position before a response label."""
    dec, drafter, ids, final = _mtp_or_medusa_on_a_repeated_prompt(zoo, method)
    index, hits = drafter.target_to_draft(), []
    if method == "mtp":
        _, m = mtp_loss(drafter, ids, 12, final, [0.6, 0.4], index, context_head=dec.head_weight(), hits=hits)
    else:
        _, m = medusa_loss(drafter, ids, 12, final, 0.8, index, context_head=dec.head_weight(), hits=hits)
    assert [j for j, _, _ in hits] == [j for j, n in enumerate(m.counted) if n]
    for j, pos, right in hits:
        assert pos.numel() == m.counted[j] and int(right.sum()) == m.correct[j]
        # step j drafts the token j + 1 after the last committed one: the label at pos + 1 is a response token
        assert int(pos.min()) >= 12 - 1 and int(pos.max()) <= ids.numel() - 2


def test_dflash_loss_scores_copied_tokens_opened_at_the_anchor(zoo):
    """DFlash drafts every slot of a block after ids[: anchor + 1] (the anchor is the pending token, which
    ContextVocab.follow has seen): a response that repeats its prompt scores each copy once its token has
    appeared by the anchor, and a token first seen inside the block itself stays unscored."""
    target = zoo.load("llama", "float32")
    dec = target.decoder
    torch.manual_seed(0)
    drafter = DFlashDrafter(default_dflash_config(target, 8, block_size=4, num_layers=1))
    drafter.set_draft_vocab(torch.arange(8))
    drafter.attach_target(dec.embed.weight, dec.head_weight(), dec.arch.embed_scale or 1.0)
    prompt = torch.randperm(target.vocab_size - 8, generator=torch.Generator().manual_seed(1))[:12] + 8
    fresh = next(t for t in range(8, target.vocab_size) if t not in prompt)  # seen only at the response's end
    ids = torch.cat([prompt, prompt[:11], torch.tensor([fresh])])  # positions 12..22 copy, position 23 is new
    feats = FeatureExtractor(target, drafter.config.runtime_layers).compute(ids.tolist())
    anchors = sample_anchors(12, len(ids), 64, None)  # 12 .. 22
    index = drafter.target_to_draft()
    _, plain = dflash_loss(drafter, ids, feats, anchors, index, 4.0, 12)
    loss, ctx = dflash_loss(drafter, ids, feats, anchors, index, 4.0, 12, context_head=dec.head_weight())
    assert sum(plain.counted) == 0
    # slot 1 of anchor a scores ids[a + 1]: the copies at 13..22 (10), not the fresh token at 23
    assert ctx.counted[0] == 10
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in drafter.parameters() if p.grad is not None)
