"""Context tokens in the draft vocabulary: the rows are the target's, drafts stay lossless, and a drafter
whose static vocabulary misses the tokens a response repeats gets its acceptance back."""

from __future__ import annotations

import pytest
import torch
from specdec import LLM, SamplingParams
from specdec.drafting.context_vocab import ContextVocab
from specdec.training.shrink_vocab import shrink_drafter_vocab

from eagle3_helpers import greedy_samples, make_random_eagle3
from medusa_helpers import make_random_medusa
from mtp_helpers import make_random_mtp
from test_dflash import make_random_dflash
from test_eagle3 import trained_bigram_drafter  # noqa: F401 (fixture)

# method -> (drafter builder with a 20-token static vocabulary, extra speculative_config keys)
DRAFTERS = {
    "eagle3": (make_random_eagle3, {"num_speculative_tokens": 3}),
    "eagle3-tree": (make_random_eagle3, {"num_speculative_tokens": 4, "tree_top_k": 3, "tree_num_draft_tokens": 10}),
    "dflash": (make_random_dflash, {"num_speculative_tokens": 5}),
    "medusa": (make_random_medusa, {"tree_num_draft_tokens": 10}),
    "mtp": (make_random_mtp, {"num_speculative_tokens": 3}),
}


def test_added_tokens_get_the_target_head_rows():
    gen = torch.Generator().manual_seed(0)
    head = torch.randn(50, 8, generator=gen)
    static = torch.tensor([3, 7, 20])
    vocab = ContextVocab(static, head[static].contiguous(), head)
    vocab.add([7, 41, 41, 2, 3, 49])  # 7 and 3 are static; 41 twice
    assert vocab.num_context_tokens == 3 and len(vocab) == 6
    assert vocab.to_target(torch.arange(6)).tolist() == [3, 7, 20, 41, 2, 49]
    x = torch.randn(4, 8, generator=gen)
    want = x @ head[vocab.to_target(torch.arange(6))].T
    assert torch.allclose(vocab.logits(x), want, atol=1e-5)
    vocab.add([99, -1])  # outside the target's vocabulary: ignored
    assert len(vocab) == 6
    vocab.reset()
    assert len(vocab) == 3 and vocab.to_target(torch.tensor([2])).item() == 20
    assert vocab.logits(x).shape == (4, 3)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_greedy_tops_are_each_rows_argmax_and_top_probability(softcap):
    """greedy_tops (the static columns' statistics over all rows, each row's context columns apart) against
    each row's whole `logits` vector: the same argmax and the same top probability, with vocabularies that
    hold different context tokens, none, and a context token tied with the best static one."""
    from specdec.drafting.context_vocab import greedy_tops

    gen = torch.Generator().manual_seed(1)
    # quarter-integers: every product and sum is exact in float32, so one row's logits are the same bits in
    # any matmul (float32 matmuls of one row and of several differ in the last bits on some CPUs)
    head = torch.randint(-8, 9, (60, 8), generator=gen).float() / 4
    static = torch.tensor([3, 7, 20, 33, 50])
    vocabs = [ContextVocab(static, head[static].contiguous(), head, softcap=softcap) for _ in range(4)]
    vocabs[0].add([41, 2, 59])
    vocabs[2].add([11])
    vocabs[3].add([8])
    x = torch.randint(-8, 9, (4, 8), generator=gen).float() / 4
    head[8] = head[static[int((x[3] @ head[static].T).argmax())]]  # row 3: a context column ties the best
    vocabs[3].reset()
    vocabs[3].add([8])
    tops = greedy_tops(vocabs, x, x @ head[static].T)
    for j, (v, (local, top)) in enumerate(zip(vocabs, tops)):
        logits = v.logits(x[j : j + 1])[0]
        assert local == int(logits.argmax()), j
        assert v.target_id(local) == int(v.to_target(torch.tensor(local)))
        assert top == pytest.approx(float(torch.softmax(logits, -1).max()), rel=1e-5)
    assert tops[3][0] < len(static)  # the tie goes to the lower id, as argmax picks


@pytest.mark.parametrize("method", list(DRAFTERS))
@pytest.mark.parametrize("context_vocab", [False, True])
def test_greedy_equals_plain_decoding_with_and_without_context_tokens(zoo, tmp_path, context_vocab, method):
    target = zoo.load("gemma3_text")
    build, extra = DRAFTERS[method]
    path = build(target, tmp_path / "d", draft_vocab_size=20)
    config = {"method": method.split("-")[0], "model": path, "context_vocab": context_vocab, **extra}
    plain, spec = LLM(loaded=target), LLM(loaded=target, speculative_config=config)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in ["The quick brown fox", "def fibonacci(n):"]:
        assert spec.generate(prompt, params)[0].outputs[0].token_ids == plain.generate(prompt, params)[0].outputs[0].token_ids
    assert (spec.proposer.vocab.num_context_tokens > 0) == context_vocab


def test_context_tokens_bring_back_acceptance_of_a_too_small_vocab(zoo, trained_bigram_drafter, tmp_path):  # noqa: F811
    """The bigram target's greedy responses cycle through a few tokens. A drafter shrunk to 24 tokens
    misses most of them; with the context's tokens it can propose them again once they were seen."""
    out, _ = trained_bigram_drafter
    target = zoo.load("bigram")
    samples = greedy_samples(target, 2, seed=3)
    shrink_drafter_vocab(out, tmp_path / "small", samples, 24)
    prompts = [s.prompt_ids for s in greedy_samples(target, 4, seed=9)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = LLM(loaded=target)
    tau = {}
    for context_vocab in (False, True):
        spec = LLM(loaded=target, speculative_config={"method": "eagle3", "model": str(tmp_path / "small"),
                                                      "num_speculative_tokens": 4, "context_vocab": context_vocab})
        for prompt in prompts:
            want = plain.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids
            assert spec.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids == want
        tau[context_vocab] = spec.stats.mean_acceptance_length
    assert tau[True] > 1.8 and tau[True] - 1 > 2 * (tau[False] - 1), tau
