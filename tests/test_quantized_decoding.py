"""Speculative decoding on quantized targets is lossless: greedy output equals plain output of the same
quantized model for every method, sampling keeps its distribution, and batches equal single sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.models import fast_linear
from specdec.models.decoder import DecoderLayer
from specdec.models.loading import load_model
from specdec.quantization import QuantizedLinear, quantized_weight
from specdec.models.runtime import ForwardCall, forward_batch
from specdec.verification import sampling_probs

from eagle3_helpers import make_random_eagle3
from medusa_helpers import make_random_medusa
from mtp_helpers import make_random_mtp
from stat_helpers import chi_square_pvalue, sample_token_ids
from test_dflash import make_random_dflash

PROMPTS = ["the cat sat on the mat. the cat sat on the mat. the cat", "abcabcabcabcabcabc", "hello world"]


def greedy(n: int = 32) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def quantized(zoo):
    """(model name, quantization) -> a freshly loaded quantized model (the zoo's dense ones stay dense)."""
    cache = {}

    def get(name: str, mode: str):
        if (name, mode) not in cache:
            cache[name, mode] = load_model(zoo.path(name), dtype="bfloat16", device="cpu", quantization=mode)
        return cache[name, mode]

    return get


def test_every_linear_and_the_head_are_quantized_and_change_the_output(zoo, quantized):
    loaded = quantized("gemma_untied", "int4")
    for layer in loaded.decoder.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            assert isinstance(getattr(layer, name), QuantizedLinear)
    assert loaded.decoder.quantized_head is not None
    ids = [5, 9, 13, 21]
    quantized_rt, dense_rt = loaded.new_runtime(), zoo.load("gemma_untied").new_runtime()
    quantized_rt.reset(16)
    dense_rt.reset(16)
    q, d = quantized_rt.forward(ids).logits, dense_rt.forward(ids).logits
    assert not torch.equal(q, d)  # really runs on the quantized weights
    assert torch.corrcoef(torch.stack([q.flatten(), d.flatten()]))[0, 1] > 0.9  # and still the same model


def _configs(target, tmp_path) -> dict[str, dict]:
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
        "self_draft": {"method": "draft_model", "model": "self:2", "num_speculative_tokens": 3},
        "eagle3_chain": {"method": "eagle3", "model": make_random_eagle3(target, tmp_path / "e"),
                         "num_speculative_tokens": 3},
        "eagle3_tree": {"method": "eagle3", "model": make_random_eagle3(target, tmp_path / "e2"),
                        "num_speculative_tokens": 3, "tree_top_k": 3, "tree_num_draft_tokens": 8},
        "medusa": {"method": "medusa", "model": make_random_medusa(target, tmp_path / "m")},
        "mtp": {"method": "mtp", "model": make_random_mtp(target, tmp_path / "t"), "num_speculative_tokens": 2},
        "dflash": {"method": "dflash", "model": make_random_dflash(target, tmp_path / "d", block_size=4)},
        "hybrid": {"method": "hybrid", "prompt_lookup_min": 1,
                   "fallback": {"method": "draft_model", "model": "self:1", "num_speculative_tokens": 2}},
    }


@pytest.mark.parametrize("mode", ["int8", "int4", "w8a8_int8"])
@pytest.mark.parametrize("method", ["ngram", "self_draft", "eagle3_chain", "eagle3_tree", "medusa", "mtp", "dflash",
                                    "hybrid"])
def test_greedy_equals_plain_decoding_of_the_quantized_model(quantized, tmp_path, mode, method, monkeypatch):
    target = quantized("gemma_untied", mode)
    config = _configs(target, tmp_path)[method]
    found = []  # the head's slice maxima found in the kernel (greedy early exit without the logits)
    max_columns = quantized_weight.QuantizedWeight.max_columns
    monkeypatch.setattr(quantized_weight.QuantizedWeight, "max_columns",
                        lambda self, x, c: found.append(max_columns(self, x, c)) or found[-1])
    plain, spec = LLM(loaded=target), LLM(loaded=target, speculative_config=config)
    for prompt in PROMPTS:
        assert spec.generate(prompt, greedy())[0].outputs[0].token_ids == plain.generate(prompt, greedy())[0].outputs[0].token_ids
    assert spec.stats.num_draft_tokens > 0  # drafts were really verified
    if quantized_weight.quant_kernel() is not None:
        assert any(f is not None for f in found)


def test_self_draft_of_all_layers_accepts_everything(quantized):
    """The acceptance check: the quantized target drafting for itself agrees with itself."""
    target = quantized("llama", "int4")
    spec = LLM(loaded=target, speculative_config={"method": "draft_model", "model": "self:4", "num_speculative_tokens": 4})
    for prompt in PROMPTS:
        spec.generate(prompt, greedy())
    assert spec.stats.acceptance_rate > 0.95


@pytest.mark.parametrize("mode", ["int8", "int4", "w8a8_int8"])
def test_batched_generation_equals_one_sequence_at_a_time(quantized, mode):
    target = quantized("llama", mode)
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    together = LLM(loaded=target, speculative_config=config).generate(PROMPTS, greedy())
    alone = LLM(loaded=target, max_num_seqs=1)
    for prompt, out in zip(PROMPTS, together):
        assert out.outputs[0].token_ids == alone.generate(prompt, greedy())[0].outputs[0].token_ids


@pytest.mark.parametrize("method, mode", [("plain", "int4"), ("ngram", "int4"), ("draft_model", "int4"),
                                          ("ngram", "w8a8_int8")])
def test_sampling_keeps_the_quantized_targets_distribution(zoo, quantized, method, mode):
    """The first two sampled tokens follow the quantized target's exact joint distribution (the second is
    drafted and verified)."""
    target = quantized("small_vocab", mode)
    prompt = [1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9, 0]
    vocab = target.vocab_size
    runtime = target.new_runtime()

    def probs(context):
        runtime.reset(64)
        return sampling_probs(runtime.forward(context, logit_rows="last").logits, 1.0, 0, 1.0)[0].double()

    p1 = probs(prompt)
    joint = torch.stack([p1[a] * probs(prompt + [a]) for a in range(vocab)]).numpy()
    config = {"plain": None, "ngram": {"method": "ngram", "num_speculative_tokens": 3},
              "draft_model": {"method": "draft_model", "model": zoo.path("small_vocab_draft"),
                              "num_speculative_tokens": 3}}[method]
    llm = LLM(loaded=target, speculative_config=config)
    samples = sample_token_ids(llm, prompt, 2000, 3, temperature=1.0)  # 3: the last two are drafted
    pairs = np.bincount(samples[:, 0] * vocab + samples[:, 1], minlength=vocab * vocab)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    if method != "plain":
        assert llm.stats.num_accepted_tokens > 100 and llm.stats.acceptance_rate < 0.95


def test_bad_quantization_values_are_clear_errors(zoo):
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        LLM(model=zoo.path("llama"), quantization="int3")
    with pytest.raises(ValueError, match="needs a GGUF model file"):
        load_model(zoo.path("llama"), quantization="gguf")
    with pytest.raises(ValueError, match="native decoder"):
        load_model(zoo.path("llama"), quantization="int8", native=False)
    with pytest.raises(ValueError, match="does not match the loaded model"):
        LLM(loaded=zoo.load("llama"), quantization="int8")


@pytest.mark.parametrize("name", ["gemma_untied", "llama", "mistral", "qwen3", "qwen2_sliding"])
@pytest.mark.parametrize("mode", ["int8", "int4", "w8a8_int8", None])
def test_the_one_call_layer_gives_the_python_layers_bits(quantized, monkeypatch, name, mode):
    """A layer whose linears are quantized, or bfloat16 (mode None: packed for the AMX kernels, else as they
    are through rows_layer_linear.cpp), runs in one C++ call (kernels/avx2_decoder_layer.cpp); the Python
    steps it replaces give the same logits: a prefill, a chain and a tree, one sequence and two in a batch,
    sliding windows (Gemma, Mistral: 8 tokens) included.
    Qwen2's projections have biases: that layer keeps the Python path."""
    kern = fast_linear.kernel()
    if kern is None or not hasattr(kern, "decoder_layer_call"):
        pytest.skip("needs the CPU kernels")
    if mode is not None and quantized_weight.quant_kernel() is None:
        pytest.skip("needs the quantized-linear kernel")
    loaded = quantized(name, mode)
    biased = name.startswith("qwen2")
    assert all((layer.layer_call_args is None) == biased for layer in loaded.decoder.layers)
    fused_calls = []
    one_call = DecoderLayer._one_call

    def counted(self, *args):
        out = one_call(self, *args)
        fused_calls.append(out is not None)
        return out

    def run() -> list[torch.Tensor]:
        first, second = loaded.new_runtime(), loaded.new_runtime()
        first.reset(48)
        second.reset(48)
        out = [first.forward(list(range(3, 17))).logits]
        first.commit(range(14))
        out.append(first.forward([7, 8, 9, 10]).logits)  # a chain
        first.commit([0, 1])
        out.append(first.forward([4, 5, 6, 11], parents=[-1, 0, 0, 1]).logits)  # a tree
        first.commit([0, 1])
        second.forward(list(range(20, 29)))
        second.commit(range(9))
        both = forward_batch([first, second], [ForwardCall([12, 13], None), ForwardCall([14, 15, 16], None)])
        return out + [r.logits for r in both]

    monkeypatch.setattr(DecoderLayer, "_one_call", counted)
    fused = run()
    assert fused_calls and all(fused_calls) != biased and any(fused_calls) != biased
    monkeypatch.setattr(DecoderLayer, "_one_call", lambda self, *args: None)
    python = run()
    for a, b in zip(fused, python):
        assert torch.equal(a, b)


def test_a_config_is_resolved_for_the_targets_quantization(quantized, monkeypatch, tmp_path):
    # a drafter's stored default for a bare config may depend on what the target's rows cost
    # (proposal_settings.default_for_kernels): LLM and the bench resolve a dict with the target's quantization
    import json

    from specdec import speculative_config
    from specdec.bench.runner import run_bench

    seen = []
    real = speculative_config.stored_entry
    monkeypatch.setattr(speculative_config, "stored_entry",
                        lambda method, options, data, quantization=None, device=None:
                        seen.append((quantization, str(device))) or real(method, options, data, quantization, device))
    target = quantized("gemma_untied", "int8")
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    LLM(loaded=target, speculative_config=ngram)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat sat on the mat, the cat sat on the", "category": "x"}) + "\n")
    run_bench(prompts, speculative_config=[ngram], max_new_tokens=4, progress=False, loaded=target, warmup=0)
    assert seen[:2] == [("int8", "cpu"), ("int8", "cpu")]  # and the device: a GPU target takes the portable default


def test_a_hybrids_fallback_is_resolved_for_the_targets_quantization(quantized, monkeypatch):
    from specdec import speculative_config
    from specdec.drafting.hybrid import HybridOptions, HybridProposer

    seen = []
    real = speculative_config.stored_entry
    monkeypatch.setattr(speculative_config, "stored_entry",
                        lambda method, options, data, quantization=None, device=None:
                        seen.append((method, quantization, str(device)))
                        or real(method, options, data, quantization, device))
    HybridProposer(HybridOptions(fallback={"method": "ngram", "num_speculative_tokens": 2}),
                   quantized("gemma_untied", "int4"))
    assert seen == [("ngram", "int4", "cpu")]


def test_w8a8_is_smoothed_from_the_calibration_text(zoo, quantized):
    """load_model runs smoothing.CALIBRATION_TEXT through the dense decoder: every quantized linear and the
    head carry SmoothQuant's multipliers, fitted to maxima the calibration actually saw (each linear's)."""
    from specdec.quantization.smoothing import CALIBRATION_TEXT, input_maxima

    loaded = quantized("gemma_untied", "w8a8_int8")
    weights = [getattr(layer, n).weight for layer in loaded.decoder.layers for n in ("qkv", "o", "gate_up", "down")]
    weights.append(loaded.decoder.quantized_head)
    assert all(w.blocks.act_scale is not None and w.kind == "s8r" for w in weights)
    dense = zoo.load("gemma_untied")
    maxima, head = input_maxima(dense.decoder, dense.tokenizer(CALIBRATION_TEXT)["input_ids"])
    assert len(maxima) == 4 * len(dense.decoder.layers) and all((m > 0).any() for m in maxima.values())
    assert head.shape == (dense.decoder.arch.hidden_size,)
