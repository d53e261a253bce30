"""Our native decoder and its KV cache: same numbers as transformers, trees equal chains, commit/truncate,
and the bit-exactness across query counts that makes speculative output identical to plain decoding."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import FAMILIES, WINDOW
from transformers import AutoModelForCausalLM

from specdec.models.attention_mask import chain_parents

NATIVE = [*FAMILIES, "qwen2_sliding"]
WINDOWED = ["mistral", "gemma3_text", "qwen2_sliding"]
PROMPT_LEN = 40  # well past the sliding window (8), so windows change the result


def random_ids(n: int, seed: int, vocab: int = 259) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def assert_logits_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    scale = float(expected.abs().max())
    assert scale > 1.0  # random models with init_std 0.5 give logits of order 10
    torch.testing.assert_close(actual, expected, atol=1e-4 * scale, rtol=1e-4)


def chain_logits(loaded, ids: list[int], capacity: int = 256) -> torch.Tensor:
    runtime = loaded.new_runtime()
    runtime.reset(capacity)
    return runtime.forward(ids).logits


# --- agreement with transformers -------------------------------------------------------------------------


@pytest.mark.parametrize("name", NATIVE)
def test_prompt_logits_match_transformers(zoo, name):
    ids = random_ids(PROMPT_LEN, seed=0)
    ours = chain_logits(zoo.load(name, "float32"), ids)
    assert ours.shape == (PROMPT_LEN, 272) and ours.dtype == torch.float32
    assert_logits_close(ours, hf_logits(zoo.hf(name), ids))


@pytest.mark.parametrize("name", NATIVE)
def test_incremental_decoding_matches_transformers(zoo, name):
    """Prefill, then chunks of 1, 5 and 3 tokens over the cache, against one transformers forward."""
    ids = random_ids(PROMPT_LEN + 9, seed=1)
    runtime = zoo.load(name, "float32").new_runtime()
    runtime.reset(128)
    rows = [runtime.forward(ids[:PROMPT_LEN]).logits]
    runtime.commit(range(PROMPT_LEN))
    start = PROMPT_LEN
    for size in (1, 5, 3):
        chunk = ids[start : start + size]
        rows.append(runtime.forward(chunk).logits)
        runtime.commit(range(size))
        start += size
    assert runtime.length == len(ids)
    assert_logits_close(torch.cat(rows), hf_logits(zoo.hf(name), ids))


@pytest.mark.parametrize("name", ["mistral", "qwen2_sliding", "gemma3_text"])
def test_sliding_window_is_applied(zoo, name):
    """Sanity check that the windowed models really slide (otherwise the tests above prove little): in Mistral
    every layer slides, so the last row cannot see the first token; in the mixed models it can, through the
    full-attention layers, and transformers agrees with us either way."""
    loaded = zoo.load(name, "float32")
    ids = random_ids(PROMPT_LEN, seed=2)
    changed = [(ids[0] + 1 - 3) % 256 + 3, *ids[1:]]
    last, last_changed = chain_logits(loaded, ids)[-1], chain_logits(loaded, changed)[-1]
    all_sliding = all(layer.window == WINDOW for layer in loaded.decoder.layers)
    assert all_sliding == (name == "mistral")
    if all_sliding:  # receptive field: num_layers * (window - 1) + 1 = 29 < 40 tokens
        assert torch.equal(last, last_changed)
    else:
        assert not torch.allclose(last, last_changed)
    assert_logits_close(last_changed, hf_logits(zoo.hf(name), changed)[-1])


@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
def test_captured_hidden_states_match_transformers(zoo, name):
    loaded, hf = zoo.load(name, "float32"), zoo.hf(name)
    ids = random_ids(20, seed=3)
    runtime = loaded.new_runtime()
    runtime.reset(64)
    layers = loaded.num_layers
    out = runtime.forward(ids, capture=range(layers + 1))
    with torch.no_grad():
        states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
    assert sorted(out.hidden) == list(range(layers + 1))
    for i in range(layers):  # the residual stream entering layer i
        torch.testing.assert_close(out.hidden[i], states[i][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.final_hidden, states[layers][0], atol=1e-4, rtol=1e-4)  # after the final norm


# --- draft trees ------------------------------------------------------------------------------------------

# Two roots; a deep branch (longer than the window) and siblings at several depths.
TREE_PARENTS = [-1, 0, 0, 1, 2, 2, -1, 6, 3, 8, 9, 10, 11, 12, 13, 14, 15]


def tree_path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("name", NATIVE)
def test_tree_forward_equals_each_path_as_a_chain(zoo, name):
    loaded = zoo.load(name, "float32")
    prompt = random_ids(20, seed=4)
    tree = random_ids(len(TREE_PARENTS), seed=5)
    assert max(len(tree_path(TREE_PARENTS, n)) for n in range(len(tree))) > WINDOW
    runtime = loaded.new_runtime()
    runtime.reset(128)
    runtime.prefill(prompt)
    tree_logits = runtime.forward(tree, parents=TREE_PARENTS).logits
    assert tree_logits.shape[0] == len(tree)
    for node in range(len(tree)):
        path = [tree[i] for i in tree_path(TREE_PARENTS, node)]
        expected = chain_logits(loaded, prompt + path)[-1]
        assert_logits_close(tree_logits[node], expected)


def test_chain_parents_equal_no_parents(zoo):
    loaded = zoo.load("gemma3_text", "float32")
    prompt, tokens = random_ids(12, seed=6), random_ids(10, seed=7)
    runtime = loaded.new_runtime()
    runtime.reset(64)
    runtime.prefill(prompt)
    as_tree = runtime.forward(tokens, parents=chain_parents(len(tokens))).logits
    as_chain = runtime.forward(tokens).logits
    assert torch.equal(as_tree, as_chain)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3_text", "qwen2_sliding"])
@pytest.mark.parametrize("kept_leaf", [5, 16])  # a short non-prefix path, and the deep branch of the second root
def test_commit_tree_path_then_continue_equals_chain(zoo, name, kept_leaf):
    loaded = zoo.load(name, "float32")
    prompt, tree, after = random_ids(20, seed=8), random_ids(len(TREE_PARENTS), seed=9), random_ids(4, seed=10)
    kept = tree_path(TREE_PARENTS, kept_leaf)
    assert kept != list(range(len(kept)))  # not a prefix: entries must move inside the cache
    runtime = loaded.new_runtime()
    runtime.reset(128)
    runtime.prefill(prompt)
    runtime.forward(tree, parents=TREE_PARENTS)
    runtime.commit(kept)
    assert runtime.length == len(prompt) + len(kept)
    continued = runtime.forward(after).logits
    expected = chain_logits(loaded, prompt + [tree[i] for i in kept] + after)[-len(after) :]
    assert_logits_close(continued, expected)


# --- commit / truncate / errors ---------------------------------------------------------------------------


def test_truncate_rolls_back_to_an_earlier_state(zoo):
    loaded = zoo.load("mistral", "float32")
    prompt, first, second = random_ids(20, seed=11), random_ids(10, seed=12), random_ids(6, seed=13)
    runtime = loaded.new_runtime()
    runtime.reset(128)
    runtime.prefill(prompt + first)
    runtime.truncate(len(prompt))
    assert runtime.length == len(prompt)
    logits = runtime.forward(second).logits
    assert_logits_close(logits, chain_logits(loaded, prompt + second)[-len(second) :])
    runtime.commit(range(3))
    runtime.truncate(len(prompt) + 3)  # no-op truncation keeps everything
    assert runtime.length == len(prompt) + 3
    assert_logits_close(runtime.forward(second[3:]).logits, chain_logits(loaded, prompt + second)[-3:])


def test_commit_of_nothing_keeps_the_committed_sequence(zoo):
    loaded = zoo.load("llama", "float32")
    prompt, junk, real = random_ids(10, seed=14), random_ids(5, seed=15), random_ids(3, seed=16)
    runtime = loaded.new_runtime()
    runtime.reset(64)
    runtime.prefill(prompt)
    runtime.forward(junk)
    runtime.commit([])
    assert runtime.length == len(prompt)
    assert_logits_close(runtime.forward(real).logits, chain_logits(loaded, prompt + real)[-3:])


@pytest.mark.parametrize("kept", [[5], [0, 0], [2, 1], [-1], [0, 1, 2, 3, 4, 5]])
def test_commit_rejects_bad_indices(zoo, kept):
    runtime = zoo.load("llama", "float32").new_runtime()
    runtime.reset(64)
    runtime.prefill(random_ids(4, seed=17))
    runtime.forward(random_ids(5, seed=18))
    with pytest.raises(ValueError, match="kept indices"):
        runtime.commit(kept)


def test_commit_twice_is_rejected(zoo):
    runtime = zoo.load("llama", "float32").new_runtime()
    runtime.reset(64)
    runtime.forward(random_ids(5, seed=19))
    runtime.commit([0, 1])
    with pytest.raises(ValueError, match="kept indices"):
        runtime.commit([0])  # nothing is pending any more


def test_capacity_overflow_is_an_error(zoo):
    runtime = zoo.load("llama", "float32").new_runtime()
    runtime.reset(16)
    runtime.prefill(random_ids(10, seed=20))
    with pytest.raises(ValueError, match="KV cache full"):
        runtime.forward(random_ids(7, seed=21))
    runtime.forward(random_ids(6, seed=21))  # exactly full is fine


@pytest.mark.parametrize("length", [-1, 11])
def test_truncate_out_of_range_is_an_error(zoo, length):
    runtime = zoo.load("llama", "float32").new_runtime()
    runtime.reset(32)
    runtime.prefill(random_ids(10, seed=22))
    with pytest.raises(ValueError, match="truncate"):
        runtime.truncate(length)


def test_forward_errors(zoo):
    runtime = zoo.load("llama", "float32").new_runtime()
    with pytest.raises(RuntimeError, match="reset"):
        runtime.forward([5])
    runtime.reset(32)
    with pytest.raises(ValueError, match="at least one token"):
        runtime.forward([])
    with pytest.raises(ValueError, match="parents"):
        runtime.forward([5, 6, 7], parents=[-1, 0])
    with pytest.raises(ValueError, match="parent"):
        runtime.forward([5, 6, 7], parents=[-1, 2, 0])  # a parent must come earlier


def test_reset_starts_a_new_sequence(zoo):
    loaded = zoo.load("llama", "float32")
    runtime = loaded.new_runtime()
    runtime.reset(64)
    runtime.prefill(random_ids(30, seed=23))
    runtime.reset(64)
    assert runtime.length == 0
    ids = random_ids(8, seed=24)
    assert_logits_close(runtime.forward(ids).logits, chain_logits(loaded, ids))


def test_logit_rows_selection(zoo):
    runtime = zoo.load("llama", "bfloat16").new_runtime()  # bfloat16: rows are exact whatever their number
    runtime.reset(64)
    ids = random_ids(6, seed=25)
    full = runtime.forward(ids).logits
    assert torch.equal(runtime.forward(ids, logit_rows="last").logits, full[-1:])
    assert torch.equal(runtime.forward(ids, logit_rows=[4, 1]).logits, full[[4, 1]])
    assert runtime.forward(ids, logit_rows=None).logits is None


# --- self-draft: the first n layers -----------------------------------------------------------------------


def hf_first_layers(zoo, name: str, num_layers: int):
    """A transformers model made of the first `num_layers` layers of `name` (same embeddings, norm and head)."""
    full = zoo.hf(name)
    config = copy.deepcopy(full.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(torch.float32).eval()
    missing, unexpected = model.load_state_dict(full.state_dict(), strict=False)
    assert not missing
    assert all(k.startswith("model.layers.") for k in unexpected)
    return model


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma3_text"])
@pytest.mark.parametrize("num_layers", [1, 3])
def test_truncated_decoder_equals_model_with_fewer_layers(zoo, name, num_layers):
    loaded = zoo.load(name, "float32")
    ids = random_ids(PROMPT_LEN, seed=26)
    runtime = loaded.new_runtime(num_layers=num_layers)
    assert runtime.num_layers == num_layers
    runtime.reset(64)
    ours = runtime.forward(ids).logits
    expected = hf_logits(hf_first_layers(zoo, name, num_layers), ids)
    assert_logits_close(ours, expected)
    # and it really is a different model from the full one
    assert not torch.allclose(ours, chain_logits(loaded, ids), atol=1e-2)


def test_truncated_with_all_layers_is_the_full_model(zoo):
    loaded = zoo.load("gemma3_text", "float32")
    ids = random_ids(20, seed=27)
    runtime = loaded.new_runtime(num_layers=loaded.num_layers)
    runtime.reset(64)
    assert torch.equal(runtime.forward(ids).logits, chain_logits(loaded, ids, capacity=64))


@pytest.mark.parametrize("num_layers", [0, 5])
def test_truncated_rejects_bad_layer_counts(zoo, num_layers):
    with pytest.raises(ValueError, match="1..4"):
        zoo.load("llama", "float32").decoder.truncated(num_layers)


# --- bit-exactness in bfloat16 ----------------------------------------------------------------------------


def exactness_case(loaded, seed: int):
    """Prompt prefilled, then 9 tokens (K + 1 for K = 8) at once versus one by one; also a rejection: of 9
    forwarded tokens only 3 are kept, and the next forward overwrites the rejected slots."""
    prompt, cont = random_ids(30, seed=seed), random_ids(9, seed=seed + 1)
    runtime = loaded.new_runtime()
    runtime.reset(128)
    runtime.prefill(prompt)
    at_once = runtime.forward(cont).logits

    runtime.reset(128)
    runtime.prefill(prompt)
    one_by_one = []
    for token in cont:
        one_by_one.append(runtime.forward([token]).logits[0])
        runtime.commit([0])
    one_by_one = torch.stack(one_by_one)

    runtime.reset(128)
    runtime.prefill(prompt)
    runtime.forward(cont[:3] + random_ids(6, seed=seed + 2))  # 6 tokens that will be rejected
    runtime.commit(range(3))
    after_rejection = runtime.forward(cont[3:]).logits
    return at_once, one_by_one, after_rejection


@pytest.mark.parametrize("name", [*NATIVE, "wide_llama"])
def test_bfloat16_rows_do_not_depend_on_how_many_tokens_share_the_forward(zoo, name):
    loaded = zoo.load(name, "bfloat16")
    assert loaded.decoder.dtype == torch.bfloat16
    at_once, one_by_one, after_rejection = exactness_case(loaded, seed=30)
    assert torch.equal(at_once, one_by_one)
    assert torch.equal(after_rejection, one_by_one[3:])


@pytest.mark.parametrize("threads", [1, 2])
def test_bfloat16_exactness_with_several_threads(zoo, threads):
    """The wide model is where CPU kernels differ between one row and many; check it per thread count."""
    loaded = zoo.load("wide_llama", "bfloat16")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        at_once, one_by_one, after_rejection = exactness_case(loaded, seed=40)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(at_once, one_by_one)
    assert torch.equal(after_rejection, one_by_one[3:])


def test_float32_runtime_does_not_claim_exactness(zoo):
    """float32 matmuls on this CPU round differently for 2 rows and for 9, so a K+1-token verification
    need not reproduce single-token rows bit for bit; the runtime must say so (bench then reports
    divergences with their logit margins instead of promising identity)."""
    loaded = zoo.load("llama", "float32")
    assert loaded.new_runtime().exact is False
    assert zoo.load("llama", "bfloat16").new_runtime().exact is True


def test_native_family_with_an_unsupported_variant_falls_back_to_transformers(tmp_path):
    from specdec.models.loading import load_model
    from tiny_models import make_tiny_model

    path = make_tiny_model(
        tmp_path, "llama", config_overrides={"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0,
                                                                   "factor": 2.0}},
    )
    loaded = load_model(path, dtype="float32")
    assert loaded.decoder is None and loaded.hf_model is not None
    assert loaded.new_runtime().exact is False
