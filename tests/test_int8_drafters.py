"""EAGLE-3 and MTP with their drafters' linears on int8 copies (speculative_config "quantization"): lossless,
actually int8 and actually drafting, sampling unchanged, and clear about where it cannot run."""

from __future__ import annotations

import pytest
from specdec import LLM, SamplingParams
from specdec.drafting import int8_weights
from specdec.quantization.kernel import quant_kernel

from eagle3_helpers import make_random_eagle3
from mtp_helpers import make_random_mtp
from stat_helpers import assert_first_tokens_follow_the_target
from test_engine import NUM_SAMPLES, SAMPLING_CASES, exact_first_tokens, small_prompt  # noqa: F401 (fixtures)

needs_kernel = pytest.mark.skipif(quant_kernel() is None, reason="the CPU int8 kernels (AVX2 and a compiler)")
PROMPTS = ["The quick brown fox", "Once upon a time, in a land", "def fibonacci(n):"]


@needs_kernel
@pytest.mark.parametrize("tree", [None, dict(tree_top_k=3, tree_num_draft_tokens=10, num_speculative_tokens=4)])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_greedy_equals_plain_decoding_with_int8_drafter_weights(zoo, tmp_path, family, tree):
    target = zoo.load(family)
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    config = {"method": "eagle3", "model": path, "num_speculative_tokens": 3, "quantization": "w8a8_int8",
              **(tree or {})}
    plain, spec = LLM(loaded=target), LLM(loaded=target, speculative_config=config)
    drafter = spec.new_proposer().drafter
    assert drafter.int8 is not None and drafter.layers[0].mlp.int8 is drafter.int8
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        assert spec.generate(prompt, params)[0].outputs[0].token_ids == plain.generate(prompt, params)[0].outputs[0].token_ids
    assert spec.stats.num_draft_tokens > 0  # the drafts were verified, not skipped
    # the int8 copies were made, the head's included
    assert {"qkv", "o", "gate_up", "down", "head"} <= set(drafter.int8._copies)


@needs_kernel
def test_int8_and_bfloat16_drafters_are_separate_and_differ(zoo, tmp_path):
    """Two configs on one target share no drafter: "none" keeps bfloat16, "w8a8_int8" its own int8 copy, and
    their draft logits differ (the int8 path is really taken) while staying close."""
    import torch

    target = zoo.load("llama")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    base = {"method": "eagle3", "model": path, "num_speculative_tokens": 3}
    bf16 = LLM(loaded=target, speculative_config={**base, "quantization": "none"}).new_proposer()
    int8 = LLM(loaded=target, speculative_config={**base, "quantization": "w8a8_int8"}).new_proposer()
    assert bf16.drafter is not int8.drafter and bf16.drafter.int8 is None and int8.drafter.int8 is not None
    normed = torch.randn(4, target.decoder.arch.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.inference_mode():
        a, b = bf16.vocab.static_logits(normed), int8.vocab.static_logits(normed)
    assert not torch.equal(a, b)
    assert float((a - b).abs().max()) < 0.05 * float(a.abs().max())


@needs_kernel
@pytest.mark.parametrize("case,shape", [("t1", "chain"), ("warped", "tree")])
def test_sampling_distribution_matches_the_target_with_int8_drafter_weights(
        zoo, tmp_path, small_prompt, exact_first_tokens, case, shape):  # noqa: F811
    target = zoo.load("small_vocab")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=10, seed=2)
    config = {"method": "eagle3", "model": path, "num_speculative_tokens": 3, "quantization": "w8a8_int8"}
    if shape == "tree":
        config.update(tree_top_k=3, tree_num_draft_tokens=8)
    llm = LLM(loaded=target, speculative_config=config)
    assert llm.new_proposer().drafter.int8 is not None
    assert_first_tokens_follow_the_target(llm, small_prompt, NUM_SAMPLES, SAMPLING_CASES[case],
                                          exact_first_tokens[case])
    assert llm.stats.num_accepted_tokens >= 100, llm.stats.num_accepted_tokens


def test_bad_quantization_values_and_missing_kernels_are_clear(zoo, tmp_path, monkeypatch):
    target = zoo.load("llama")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    base = {"method": "eagle3", "model": path, "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="'auto', 'none', 'w8a8_int8'"):
        LLM(loaded=target, speculative_config={**base, "quantization": "int4"})
    monkeypatch.setattr(int8_weights, "quant_kernel", lambda: None)
    with pytest.raises(ValueError, match="needs the CPU int8 kernels"):
        LLM(loaded=target, speculative_config={**base, "quantization": "w8a8_int8"}).new_proposer()
    # "auto" without the kernels keeps the bfloat16 weights; null is vLLM's "not quantized"
    assert LLM(loaded=target, speculative_config=base).new_proposer().drafter.int8 is None
    assert LLM(loaded=target, speculative_config={**base, "quantization": None}).new_proposer().drafter.int8 is None


def test_shapes_the_kernels_cannot_take_are_refused_or_kept_in_bfloat16(zoo, tmp_path):
    from specdec.drafting.int8_weights import shape_problems

    assert shape_problems([64, 128]) == []
    assert "multiples of 32" in shape_problems([64, 48])[0]


@needs_kernel
@pytest.mark.parametrize("tree", [None, dict(tree_top_k=3, tree_num_draft_tokens=8, num_speculative_tokens=3)])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_mtp_greedy_equals_plain_decoding_with_int8_block_weights(zoo, tmp_path, family, tree):
    """MTP's blocks (our DecoderLayer) on int8 copies through the one-call layer, and its head rows: the
    output is plain decoding's, drafts are verified, and the blocks really hold quantized linears."""
    from specdec.quantization.quantized_weight import QuantizedLinear

    target = zoo.load(family)
    path = make_random_mtp(target, tmp_path / "d", draft_vocab_size=200, num_modules=2)
    config = {"method": "mtp", "model": path, "num_speculative_tokens": 3, "quantization": "w8a8_int8", **(tree or {})}
    plain, spec = LLM(loaded=target), LLM(loaded=target, speculative_config=config)
    proposer = spec.new_proposer()
    blocks = [m.block for m in proposer.drafter.layers]
    assert all(isinstance(getattr(b, n), QuantizedLinear) for b in blocks for n in ("qkv", "o", "gate_up", "down"))
    assert proposer.vocab.static_weight is proposer.drafter.int8_head is not None
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        assert spec.generate(prompt, params)[0].outputs[0].token_ids == plain.generate(prompt, params)[0].outputs[0].token_ids
    assert spec.stats.num_draft_tokens > 0
    none = LLM(loaded=target, speculative_config={**config, "quantization": "none"}).new_proposer()
    assert none.drafter is not proposer.drafter and none.drafter.int8_head is None


@needs_kernel
def test_mtp_sampling_distribution_matches_the_target_with_int8_block_weights(
        zoo, tmp_path, small_prompt, exact_first_tokens):  # noqa: F811
    target = zoo.load("small_vocab")
    path = make_random_mtp(target, tmp_path / "d", draft_vocab_size=10, seed=2)
    llm = LLM(loaded=target, speculative_config={"method": "mtp", "model": path, "num_speculative_tokens": 3,
                                                  "quantization": "w8a8_int8"})
    assert llm.new_proposer().drafter.int8_head is not None
    assert_first_tokens_follow_the_target(llm, small_prompt, NUM_SAMPLES, SAMPLING_CASES["t1"],
                                          exact_first_tokens["t1"])
    assert llm.stats.num_accepted_tokens >= 100, llm.stats.num_accepted_tokens


@needs_kernel
@pytest.mark.parametrize("isa", ["avx2", "avx512_vnni", "amx_int8"])
def test_auto_takes_int8_where_it_was_measured_faster(zoo, tmp_path, monkeypatch, isa):
    """"auto": EAGLE-3's drafter on int8 copies on every build; MTP's blocks only on AVX512-VNNI and AMX
    (slower than bfloat16 on an AVX2 EPYC)."""
    monkeypatch.setattr(int8_weights, "quant_kernel_isa", lambda: isa)
    target = zoo.load("llama")
    eagle = make_random_eagle3(target, tmp_path / "e", draft_vocab_size=200)
    mtp = make_random_mtp(target, tmp_path / "m", draft_vocab_size=200, num_modules=2)
    auto = {"num_speculative_tokens": 3, "quantization": "auto"}
    eagle3 = LLM(loaded=target, speculative_config={"method": "eagle3", "model": eagle, **auto}).new_proposer()
    assert eagle3.drafter.int8 is not None
    mtp_drafter = LLM(loaded=target, speculative_config={"method": "mtp", "model": mtp, **auto}).new_proposer().drafter
    assert (mtp_drafter.int8_head is not None) == (isa != "avx2")
