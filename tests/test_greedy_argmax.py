"""greedy_argmax (the kernels' rows_argmax on CPU) picks what torch.argmax picks: the first maximum, the
first NaN, whatever the row length (vector lanes and the scalar tail)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.models import fast_linear
from specdec.models.greedy_argmax import greedy_argmax

needs_kernel = pytest.mark.skipif(fast_linear.kernel() is None, reason="no CPU kernels on this machine")


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 5), length=st.integers(1, 70), seed=st.integers(0, 2**31 - 1),
       special=st.sampled_from(["none", "nan", "inf", "-inf rows", "ties"]))
def test_same_index_as_torch(rows, length, seed, special):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (rows, length), generator=g).float()  # few values: many ties across lanes
    if special == "nan":
        x[0, int(torch.randint(0, length, (), generator=g))] = float("nan")
    elif special == "inf":
        x[-1, int(torch.randint(0, length, (), generator=g))] = float("inf")
    elif special == "-inf rows":
        x[:] = float("-inf")
    elif special == "ties":
        x[:] = 1.0
    assert torch.equal(fast_linear.kernel().rows_argmax(x), x.argmax(-1))
    assert torch.equal(greedy_argmax(x), x.argmax(-1))


def test_shapes_and_the_torch_path():
    x = torch.randn(2, 3, 1000)
    assert torch.equal(greedy_argmax(x), x.argmax(-1))  # leading dims kept
    assert torch.equal(greedy_argmax(x[0, 0]), x[0, 0].argmax(-1))  # one row: a 0-dim result
    assert torch.equal(greedy_argmax(x[:, 0, ::2]), x[:, 0, ::2].argmax(-1))  # not contiguous
    y = x.double()  # not float32: torch's argmax
    assert torch.equal(greedy_argmax(y), y.argmax(-1))


@needs_kernel
def test_a_wide_row_with_its_maximum_in_the_tail():
    x = torch.zeros(3, 262_147)
    x[0, -1] = 1.0  # the scalar tail after the last full vector
    x[1, 5] = x[1, 262_140] = 2.0  # the first of two maxima
    x[2, 262_146] = float("nan")
    assert greedy_argmax(x).tolist() == [262_146, 5, 262_146]
