"""kernels/avx2_draft_attention.cpp: the drafters' causal attention of a whole step in one call, bit for bit the
arithmetic its header documents, close to torch's attention, and each sequence's rows independent of the
others in the call."""

from __future__ import annotations

import math

import pytest
import torch

from kernel_exp import documented_exp
from specdec.models import fast_linear

kernel = fast_linear.kernel()
pytestmark = pytest.mark.skipif(kernel is None or not hasattr(kernel, "draft_attention"), reason="no kernels")


def documented_row(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One row and head as the header says: q [D], keys/values [T, D] (the visible entries), float32 ops."""
    t, d = keys.shape
    products = (q[None] * keys).view(t, d // 8, 8)
    lanes = torch.zeros(t, 8)
    for c in range(d // 8):  # dimension d into lane d mod 8, ascending
        lanes = lanes + products[:, c]
    four = lanes[:, :4] + lanes[:, 4:]
    two = four[:, :2] + four[:, 2:]
    s = (two[:, 0] + two[:, 1]) * torch.tensor(scale, dtype=torch.float32)
    e = documented_exp(s - s.max())
    total = torch.tensor(0.0)
    for x in e:
        total = total + x
    acc = torch.zeros(d)
    for i in range(t):
        acc = acc + e[i] * values[i]
    return acc * (torch.tensor(1.0) / total)


def caches(lengths: list[int], kv_heads: int, dim: int, capacity: int = 40, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        k = torch.randn(kv_heads, capacity, dim, generator=gen)
        v = torch.randn(kv_heads, capacity, dim, generator=gen)
        out.append((k[:, :n], v[:, :n]))  # views of a larger cache, as DraftKVCache.append returns
    return out


@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (4, 2)])
def test_every_row_is_the_documented_arithmetic(heads, kv_heads):
    dim, lengths, rows = 16, [7, 1, 20, 12], [1, 1, 3, 2]
    kv = caches(lengths, kv_heads, dim)
    q = torch.randn(heads, sum(rows), dim, generator=torch.Generator().manual_seed(1))
    scale = 1 / math.sqrt(dim)
    out = kernel.draft_attention(q, [k for k, _ in kv], [v for _, v in kv], rows, scale)
    start = 0
    for (k, v), n, length in zip(kv, rows, lengths):
        for r in range(n):
            visible = length - n + r + 1  # causal: the cache before the new rows and the new rows up to r
            for h in range(heads):
                g = h // (heads // kv_heads)
                want = documented_row(q[h, start + r], k[g, :visible], v[g, :visible], scale)
                assert torch.equal(out[h, start + r], want), (start + r, h)
                close = torch.softmax(q[h, start + r] @ k[g, :visible].T * scale, -1) @ v[g, :visible]
                torch.testing.assert_close(out[h, start + r], close, rtol=1e-5, atol=1e-5)
        start += n


def test_long_rows_split_over_keys_and_dimensions_keep_the_documented_arithmetic():
    """Rows over more entries than one piece of the scores' work (128) and heads wider than one piece of the
    values' (64 dimensions, the last one partial): the threads split them, and every row stays bit for bit the
    header's arithmetic, as when one thread runs it all."""
    dim, heads, lengths, rows = 136, 4, [300, 5], [2, 1]
    kv = caches(lengths, 1, dim, capacity=320, seed=6)
    q = torch.randn(heads, sum(rows), dim, generator=torch.Generator().manual_seed(7))
    scale = 1 / math.sqrt(dim)
    out = kernel.draft_attention(q, [k for k, _ in kv], [v for _, v in kv], rows, scale)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = kernel.draft_attention(q, [k for k, _ in kv], [v for _, v in kv], rows, scale)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out, one_thread)
    start = 0
    for (k, v), n, length in zip(kv, rows, lengths):
        for r in range(n):
            visible = length - n + r + 1
            for h in range(heads):
                assert torch.equal(out[h, start + r], documented_row(q[h, start + r], k[0, :visible], v[0, :visible], scale))
        start += n


def test_a_sequences_rows_do_not_depend_on_the_others_in_the_call():
    dim, heads = 16, 4
    kv = caches([9, 15, 4], 1, dim, seed=2)
    q = torch.randn(heads, 3, dim, generator=torch.Generator().manual_seed(3))
    together = kernel.draft_attention(q, [k for k, _ in kv], [v for _, v in kv], [1, 1, 1], 0.25)
    for i, (k, v) in enumerate(kv):
        alone = kernel.draft_attention(q[:, i : i + 1].contiguous(), [k], [v], [1], 0.25)
        assert torch.equal(together[:, i : i + 1], alone)


def test_listed_entries_are_the_documented_arithmetic_over_them():
    """A draft tree's level: each row sees entries 0 .. P - 1 and its listed ones (its ancestors and itself),
    in that order; a causal sequence beside it in the same call keeps its own rows."""
    from specdec.drafting.eagle3_model import ListedVisibility

    dim, heads, kv_heads = 16, 4, 1
    kv = caches([14, 6], kv_heads, dim, seed=4)
    level = ListedVisibility(8, [[9, 11], [10, 12], [13]])  # three new rows (entries 11-13) over a context of 8
    q = torch.randn(heads, 3 + 2, dim, generator=torch.Generator().manual_seed(5))
    scale = 1 / math.sqrt(dim)
    out = kernel.draft_attention(q, [k for k, _ in kv], [v for _, v in kv], [3, 2], scale,
                                 [level.slots(), torch.empty(0, dtype=torch.long)])
    k, v = kv[0]
    for r, entries in enumerate(level.listed):
        seen = list(range(level.prefix)) + entries
        for h in range(heads):
            assert torch.equal(out[h, r], documented_row(q[h, r], k[0, seen], v[0, seen], scale)), (r, h)
    causal = kernel.draft_attention(q[:, 3:].contiguous(), [kv[1][0]], [kv[1][1]], [2], scale)
    assert torch.equal(out[:, 3:], causal)
    mask = level.mask(14, torch.device("cpu"))
    assert mask.sum().item() == 3 * 8 + 5 and bool(mask[0, 9]) and not bool(mask[0, 10])


def test_bad_listed_entries_are_refused():
    from specdec.drafting.eagle3_model import ListedVisibility

    kv = caches([10], 1, 16)
    q = torch.randn(4, 2, 16)
    for bad in (ListedVisibility(5, [[6, 6], [9]]), ListedVisibility(5, [[4], [9]]), ListedVisibility(5, [[6], [10]]),
                ListedVisibility(11, [[], []])):
        with pytest.raises(RuntimeError, match="slots"):
            kernel.draft_attention(q, [kv[0][0]], [kv[0][1]], [2], 0.25, [bad.slots()])


def test_bad_arguments_are_refused():
    kv = caches([5], 1, 16)
    q = torch.randn(4, 2, 16)
    with pytest.raises(RuntimeError, match="add up"):
        kernel.draft_attention(q, [kv[0][0]], [kv[0][1]], [1], 0.25)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.draft_attention(q.to(torch.bfloat16), [kv[0][0]], [kv[0][1]], [2], 0.25)
    with pytest.raises(RuntimeError, match="hold its new rows"):
        kernel.draft_attention(torch.randn(4, 9, 16), [kv[0][0]], [kv[0][1]], [9], 0.25)


def drafter_step_case(zoo, tmp_path, seed: int, scale: float = 1.0, quantization: str = "none"):
    """A random EAGLE-3 drafter on the tiny Gemma 3 (its linears in bfloat16, or on int8 copies with
    `quantization` "w8a8_int8") and run(tree) -> (layer outputs, caches): one step_batch of three sequences
    (1, 3 and 2 new rows over contexts of 4, 7 and 2 cached entries), the second one either causal or a
    draft tree's level (three nodes over a context of 4: entries 4-6 hold a first level, whose nodes 0 and 2
    are the parents of the new rows 7-9)."""
    from eagle3_helpers import make_random_eagle3
    from specdec import LLM
    from specdec.drafting.eagle3_model import DraftKVCache, ListedVisibility

    target = zoo.load("gemma3_text")
    llm = LLM(loaded=target, speculative_config={"method": "eagle3", "num_speculative_tokens": 3,
                                                  "model": make_random_eagle3(target, tmp_path / "d"),
                                                  "quantization": quantization})
    drafter = llm.new_proposer().drafter
    assert (drafter.int8 is not None) == (quantization != "none")
    c = drafter.config
    gen = torch.Generator().manual_seed(seed)
    rows = [1, 3, 2]
    h = (torch.randn(sum(rows), c.hidden_size, generator=gen) * scale).to(torch.bfloat16)
    tokens = torch.randint(0, 50, (sum(rows),), generator=gen)
    level = ListedVisibility(4, [[4, 7], [4, 8], [6, 9]])

    def run(tree: bool = False) -> tuple[torch.Tensor, list[DraftKVCache]]:
        caches = [DraftKVCache(c.num_key_value_heads, c.head_dim, 32, torch.float32, torch.device("cpu"))
                  for _ in rows]
        for cache, past in zip(caches, (4, 7, 2)):  # some context already cached
            shape = (c.num_key_value_heads, past, c.head_dim)
            cache.append(torch.randn(shape, generator=torch.Generator().manual_seed(past)),
                         torch.randn(shape, generator=torch.Generator().manual_seed(past + 1)))
        positions = torch.tensor([4, 7, 8, 9, 2, 3] if not tree else [4, 5, 5, 5, 2, 3])
        visibles = [rows[0], level if tree else rows[1], rows[2]]
        with torch.inference_mode():
            return drafter.step_batch(h, tokens, positions, caches, visibles), caches

    return drafter, run


def test_a_drafter_step_with_the_kernel_matches_the_torch_path(zoo, tmp_path, monkeypatch):
    """Eagle3Drafter.step_batch: causal steps of up to KERNEL_ROWS rows per sequence take the kernel; the
    layer outputs stay within float32 rounding of the per-sequence torch attention."""
    from specdec.drafting import eagle3_model

    _, step = drafter_step_case(zoo, tmp_path, seed=4)

    def run(tree: bool = False) -> torch.Tensor:
        return step(tree)[0]

    calls: list[int] = []
    real = eagle3_model._kernel_attention
    monkeypatch.setattr(eagle3_model, "_kernel_attention", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(eagle3_model.Eagle3Drafter, "_fused_step", lambda *a: None)  # the Python kernel path
    with_kernel, tree_with_kernel = run(), run(tree=True)
    assert len(calls) == 2
    assert not torch.equal(tree_with_kernel[1:4], with_kernel[1:4]) and torch.equal(tree_with_kernel[4:], with_kernel[4:])
    monkeypatch.setattr(eagle3_model, "_draft_kernel", lambda q: None)
    torch_path, tree_torch_path = run(), run(tree=True)
    torch.testing.assert_close(with_kernel.float(), torch_path.float(), rtol=0.02, atol=0.02)
    torch.testing.assert_close(tree_with_kernel.float(), tree_torch_path.float(), rtol=0.02, atol=0.02)


def test_the_fused_qkv_projection_gives_the_three_projections_bits(zoo, tmp_path):
    """Inference runs q, k and v as one linear over their stacked weights: the same bits as three."""
    from eagle3_helpers import make_random_eagle3
    from specdec import LLM

    from specdec.drafting.draft_layers import rope
    from specdec.models.fast_linear import module_linear

    target = zoo.load("gemma3_text", "bfloat16")
    llm = LLM(loaded=target, speculative_config={"method": "eagle3", "num_speculative_tokens": 3,
                                                  "model": make_random_eagle3(target, tmp_path / "d"),
                                                  "quantization": "none"})
    attn = llm.new_proposer().drafter.layers[0].self_attn
    assert attn.q_proj.weight.dtype == torch.bfloat16
    x = torch.randn(5, attn.q_proj.in_features, generator=torch.Generator().manual_seed(6)).bfloat16()
    positions = torch.arange(3, 8)
    with torch.inference_mode():
        fused = attn.qkv(x, positions)
        c = attn.c
        parts = [module_linear(m, x).view(5, heads, c.head_dim).transpose(0, 1)
                 for m, heads in ((attn.q_proj, c.num_attention_heads), (attn.k_proj, c.num_key_value_heads),
                                  (attn.v_proj, c.num_key_value_heads))]
    separate = (rope(parts[0], positions, c.rope_theta), rope(parts[1], positions, c.rope_theta), parts[2])
    for a, b in zip(fused, separate):
        assert torch.equal(a, b)


@pytest.mark.skipif(kernel is None or not hasattr(kernel, "draft_layer_call"), reason="needs the CPU kernels")
@pytest.mark.parametrize("quantization", ["none", "w8a8_int8"])
def test_the_fused_draft_layer_gives_the_python_paths_bits(zoo, tmp_path, monkeypatch, quantization):
    """kernels/avx2_draft_layer.cpp runs Eagle3Drafter.step_batch's kernel path in one call: the same outputs
    and the same new cache entries, bit for bit, for causal steps and a tree level, several sequences at once,
    on bfloat16 weights (AMX-packed, or as they are elsewhere) and on int8 copies; and it is the path taken (a
    broken weight changes its outputs)."""
    from specdec.drafting import eagle3_model

    drafter, run = drafter_step_case(zoo, tmp_path, seed=7, scale=20, quantization=quantization)

    fused_calls: list[bool] = []
    real = eagle3_model.Eagle3Drafter._fused_step

    def counted(*a):
        out = real(*a)
        fused_calls.append(out is not None)
        return out

    monkeypatch.setattr(eagle3_model.Eagle3Drafter, "_fused_step", counted)
    fused = [run(False), run(True)]
    assert fused_calls == [True, True]
    monkeypatch.setattr(eagle3_model.Eagle3Drafter, "_fused_step", lambda *a: None)
    python = [run(False), run(True)]
    for (out, caches), (want, want_caches) in zip(fused, python):
        assert torch.equal(out, want)
        for cache, other in zip(caches, want_caches):
            assert cache.length == other.length
            assert torch.equal(cache.k, other.k) and torch.equal(cache.v, other.v)
    monkeypatch.setattr(eagle3_model.Eagle3Drafter, "_fused_step", real)
    with torch.no_grad():
        drafter.layers[0].mlp.down_proj.weight.mul_(2)  # then repacked, as loading packs it
    from specdec.models import fast_linear as fl
    fl.pack_weight(drafter.layers[0].mlp.down_proj.weight)
    assert not torch.equal(run(False)[0], fused[0][0])


def test_a_bfloat16_cache_gives_the_float32_caches_bits():
    """draft_attention widens a bfloat16 cache's entries to float32 as it reads them: with the same values
    (the drafter's keys and values are bfloat16 products) every output has the float32 cache's bits, causal
    rows and listed ones alike."""
    heads, kv_heads, dim, lengths, rows = 4, 1, 32, [9, 30, 14], [1, 3, 2]
    gen = torch.Generator().manual_seed(3)
    keys = [torch.randn(kv_heads, n, dim, generator=gen).bfloat16() for n in lengths]
    values = [torch.randn(kv_heads, n, dim, generator=gen).bfloat16() for n in lengths]
    q = torch.randn(heads, sum(rows), dim, generator=gen)
    none = torch.empty(0, dtype=torch.long)
    for slots in ([], [none, torch.tensor([[20, 22, 27], [20, 23, 28], [20, 29, -1]]), none]):
        want = kernel.draft_attention(q, [k.float() for k in keys], [v.float() for v in values], rows, 0.2, slots)
        got = kernel.draft_attention(q, keys, values, rows, 0.2, slots)
        assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="all float32 or all bfloat16"):
        kernel.draft_attention(q, [keys[0], keys[1].float(), keys[2]], values, rows, 0.2)


def test_the_drafters_inference_cache_is_bfloat16_with_the_kernels(zoo, tmp_path):
    """An EAGLE-3 proposer on a bfloat16 target keeps its drafter cache in bfloat16 where the kernels run its
    attention, and its drafts equal those of a float32 cache (the same values, the same float32 sums)."""
    from eagle3_helpers import make_random_eagle3
    from specdec import LLM, SamplingParams
    from specdec.drafting import eagle3_model

    target = zoo.load("gemma3_text")
    config = {"method": "eagle3", "num_speculative_tokens": 4, "tree_top_k": 2, "tree_num_draft_tokens": 6,
              "model": make_random_eagle3(target, tmp_path / "d")}
    params = SamplingParams(max_tokens=24, temperature=0.0)
    prompt = {"prompt_token_ids": list(range(3, 40))}

    from specdec.drafting.eagle3 import Eagle3Proposer

    def drafted(dtype: torch.dtype | None) -> tuple[list, list]:
        llm = LLM(loaded=target, speculative_config=config)
        seen: list = []
        drafts: list = []
        real, real_propose = eagle3_model.DraftKVCache.__init__, Eagle3Proposer.propose_batch.__func__

        def init(self, kv_heads, head_dim, capacity, cache_dtype, device):
            seen.append(cache_dtype)
            real(self, kv_heads, head_dim, capacity, dtype or cache_dtype, device)

        def propose(cls, *a):
            out = real_propose(cls, *a)
            drafts.extend((d.tokens, d.parents) for d in out)
            return out

        eagle3_model.DraftKVCache.__init__ = init
        Eagle3Proposer.propose_batch = classmethod(propose)
        try:
            out = llm.generate(prompt, params)
        finally:
            eagle3_model.DraftKVCache.__init__ = real
            Eagle3Proposer.propose_batch = classmethod(real_propose)
        return seen, [out[0].outputs[0].token_ids, drafts]

    if target.dtype != torch.bfloat16:
        pytest.skip("a bfloat16 target")
    seen, bf16 = drafted(None)
    assert seen and all(d == torch.bfloat16 for d in seen)
    _, f32 = drafted(torch.float32)
    assert len(bf16[1]) > 3 and any(len(tokens) > 1 for tokens, _ in bf16[1])  # trees were drafted
    assert bf16 == f32
