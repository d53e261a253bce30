"""The packed LM head (kernels/bf16_packed_linear.cpp, AVX512-BF16 CPUs): every row's logits are the same
bits whatever the number of rows, and any slice or set of token ids scores what the whole head gives."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.models import fast_linear
from specdec.models.packed_head import PackedHead

packed = pytest.mark.skipif(fast_linear.kernel() is None or not hasattr(fast_linear.kernel(), "packed_rows_linear"),
                            reason="the packed head needs the AVX512-BF16 kernels")


def _head(n: int, k: int, seed: int) -> tuple[PackedHead, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g).bfloat16()
    head = PackedHead.build(weight)
    assert head is not None
    return head, torch.randn(70, k, generator=g).bfloat16()


@packed
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), k=st.integers(1, 90), seed=st.integers(0, 2**31 - 1), data=st.data())
def test_rows_slices_and_ids_have_the_whole_heads_bits(n, k, seed, data):
    head, x = _head(n, k, seed)
    full = head.linear_float(x)
    expected = x.float() @ head.weight.float().T
    assert torch.allclose(full, expected, rtol=1e-4, atol=1e-3 * k**0.5)  # float32 sums of exact products
    for m in (1, 2, 3, 5, 6, 7, 13, 33, 70):  # every row block shape of the kernel
        start = data.draw(st.integers(0, 70 - m))
        assert torch.equal(head.linear_float(x[start : start + m]), full[start : start + m])
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    assert torch.equal(head.linear_columns(x[:9], slice(lo, hi)), full[:9, lo:hi])
    ids = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20)))
    assert torch.equal(head.linear_columns(x[:4], ids), full[:4, ids])


@packed
def test_the_decoder_scores_its_head_through_the_packed_panels(tmp_path):
    from specdec.models.loading import load_model
    from tiny_models import make_tiny_model

    decoder = load_model(make_tiny_model(tmp_path / "m", "gemma3_text"), dtype="bfloat16").decoder
    assert decoder.packed_head is not None
    hidden = torch.randn(5, decoder.arch.hidden_size).bfloat16()
    logits = decoder.logits(hidden)
    assert torch.equal(decoder.logits(hidden[2:3]), logits[2:3])
    assert torch.equal(decoder.logits(hidden, slice(3, 40)), logits[:, 3:40])
    assert torch.equal(decoder.logits(hidden, torch.tensor([7, 1, 7])), logits[:, [7, 1, 7]])
    assert decoder.truncated(1).packed_head is decoder.packed_head
    packed = decoder.packed_head
    assert decoder.prepare().packed_head is packed  # unchanged weights: not packed again
    with torch.no_grad():
        decoder.head_weight()[3] += 1  # changed in place: packed anew, so the logits follow the weights
    assert decoder.prepare().packed_head is not packed
    fresh = PackedHead.build(decoder.head_weight())
    assert torch.equal(decoder.packed_head.linear_float(hidden), fresh.linear_float(hidden))
    assert not torch.equal(decoder.packed_head.linear_float(hidden)[:, 3], packed.linear_float(hidden)[:, 3])


def test_no_packed_head_for_other_dtypes():
    assert PackedHead.build(torch.randn(8, 4)) is None
