"""Weights packed once in the AMX tile layout (kernels/amx_packed_linear.cpp, fast_linear.pack_weight): the
bits of the dense kernel for every shape, tail and row count, and a packed copy that is never used once
its weight has changed."""

from __future__ import annotations

import pytest
import torch

from specdec.models import fast_linear

pytestmark = pytest.mark.skipif(fast_linear.kernel_isa() != "amx", reason="weights are packed for the AMX kernels only")


@pytest.mark.parametrize("m,k,n", [(1, 640, 1536), (5, 64, 70), (16, 100, 33), (17, 640, 4097), (33, 96, 40),
                                   (150, 2048, 97), (200, 640, 1030), (64, 7, 24)])
def test_packed_weights_give_the_dense_kernels_bits(m: int, k: int, n: int) -> None:
    kern = fast_linear.kernel()
    torch.manual_seed(m + k + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    packed = kern.amx_pack_weight(w)
    assert torch.equal(kern.amx_packed_linear(x, packed, n, False), kern.rows_linear(x, w))
    assert torch.equal(kern.amx_packed_linear(x, packed, n, True).view(torch.int16),
                       kern.rows_linear(x, w).to(torch.bfloat16).view(torch.int16))
    alone = torch.cat([kern.amx_packed_linear(x[i : i + 1], packed, n, False) for i in range(m)])
    assert torch.equal(alone, kern.rows_linear(x, w))


def test_a_packed_copy_is_dropped_when_its_weight_changes() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 96).bfloat16()
    x = torch.randn(3, 96).bfloat16()
    assert fast_linear.pack_weight(w)
    assert fast_linear.packed_copy(w) is not None
    before = fast_linear.linear(x, w)
    assert torch.equal(before, fast_linear.kernel().rows_linear_bf16(x, w))
    w.mul_(2)  # in place: the packed copy is stale
    assert fast_linear.packed_copy(w) is None
    assert torch.equal(fast_linear.linear(x, w), fast_linear.kernel().rows_linear_bf16(x, w))
    assert not torch.equal(fast_linear.linear(x, w), before)


def test_bad_shapes_are_refused() -> None:
    kern = fast_linear.kernel()
    packed = kern.amx_pack_weight(torch.randn(40, 64).bfloat16())
    with pytest.raises(RuntimeError, match="K does not match"):
        kern.amx_packed_linear(torch.randn(2, 96).bfloat16(), packed, 40, True)
    with pytest.raises(RuntimeError, match="n_size"):
        kern.amx_packed_linear(torch.randn(2, 64).bfloat16(), packed, 100, True)


def test_the_decoder_packs_its_linears_and_gets_the_same_tokens(zoo) -> None:
    loaded = zoo.load("wide_llama")
    layer = loaded.decoder.layers[0]
    assert all(fast_linear.packed_copy(getattr(layer, name).weight) is not None for name in ("qkv", "o", "gate_up", "down"))
    runtime = loaded.new_runtime()
    runtime.reset(64)
    packed = runtime.forward([3, 9, 4, 7, 1] * 8, logit_rows="all").logits
    fast_linear._PACKED.clear()
    runtime.reset(64)
    dense = runtime.forward([3, 9, 4, 7, 1] * 8, logit_rows="all").logits
    assert torch.equal(packed, dense)
    loaded.decoder.prepare()  # packs again for the other tests
