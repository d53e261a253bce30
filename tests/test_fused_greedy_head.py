"""The LM head fused with the greedy argmax (kernels/amx_rows_argmax_linear.cpp): the token of every row is
the one rows_argmax(rows_linear(x, w)) picks, ties, NaN and tails included; and a batched greedy forward
that asks for the argmax alone returns the same tokens as one that computes the logits."""

from __future__ import annotations

import pytest
import torch

from specdec.models import fast_linear
from specdec.models.greedy_argmax import fused_greedy_argmax, greedy_argmax
from specdec.models.runtime import ForwardCall, forward_batch
from specdec.verification.tree import verify_tree_greedy

FUSED = hasattr(fast_linear.kernel(), "rows_argmax_linear")


@pytest.mark.skipif(not FUSED, reason="the fused head is built with the AMX kernels only")
@pytest.mark.parametrize("m,k,n", [(1, 640, 1000), (3, 64, 33), (17, 100, 70), (33, 640, 4097), (70, 96, 3000),
                                   (96, 640, 4097), (130, 64, 100)])  # 3 m tiles and up: the wide passes
def test_fused_argmax_is_the_argmax_of_the_kernel_logits(m: int, k: int, n: int) -> None:
    torch.manual_seed(m * 1000 + n)
    x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    kernel = fast_linear.kernel()
    assert torch.equal(kernel.rows_argmax_linear(x, w), kernel.rows_argmax(kernel.rows_linear(x, w)))


@pytest.mark.skipif(not FUSED, reason="the fused head is built with the AMX kernels only")
def test_fused_argmax_keeps_the_first_maximum_and_the_first_nan() -> None:
    kernel = fast_linear.kernel()
    x = torch.ones(20, 64).bfloat16()
    w = torch.zeros(5000, 64).bfloat16()
    w[2500] = 1  # columns tied across the threads' ranges and blocks: the first one wins
    w[4900] = 1
    assert kernel.rows_argmax_linear(x, w).tolist() == [2500] * 20
    w[3000, 0] = float("nan")
    w[4000, 0] = float("nan")
    assert kernel.rows_argmax_linear(x, w).tolist() == [3000] * 20
    w = torch.full((300, 64), float("-inf")).bfloat16()  # every logit -inf (or NaN from -inf * 0): index 0
    x = torch.zeros(2, 64).bfloat16()
    x[:, 0] = 1
    assert kernel.rows_argmax_linear(x, w).tolist() == torch.argmax(kernel.rows_linear(x, w), -1).tolist()


def test_fused_argmax_declines_what_it_does_not_cover() -> None:
    assert fused_greedy_argmax(torch.randn(2, 8), torch.randn(5, 8)) is None  # float32: not the kernel's
    if not FUSED:
        assert fused_greedy_argmax(torch.randn(2, 8).bfloat16(), torch.randn(5, 8).bfloat16()) is None


def test_a_forward_without_logits_must_ask_for_the_argmax() -> None:
    with pytest.raises(ValueError, match="argmax"):
        ForwardCall([1, 2], logits=False)


def test_greedy_verification_from_the_argmax_alone() -> None:
    logits = torch.randn(4, 50)
    tokens = greedy_argmax(logits).tolist()[:3]
    parents = [-1, 0, 1]
    assert verify_tree_greedy(tokens, parents, None, greedy_argmax(logits)) == verify_tree_greedy(tokens, parents, logits)
    with pytest.raises(ValueError, match="logits or their argmax"):
        verify_tree_greedy(tokens, parents, None, None)


@pytest.mark.parametrize("model", ["gemma_untied", "wide_llama"])
def test_a_batch_without_logits_gives_the_tokens_of_one_with_them(zoo, model: str) -> None:
    loaded = zoo.load(model)

    def run(logits: bool) -> list:
        runtimes, calls = [], []
        for i, rows in enumerate((1, 5, 3)):
            runtime = loaded.new_runtime()
            runtime.reset(64)
            runtime.prefill([5 + i, 9, 11 + i, 4])
            runtimes.append(runtime)
            calls.append(ForwardCall([7 + j for j in range(rows)], [-1, 0, 0, 1, 1][:rows] if i == 1 else None,
                                     logit_rows="all", argmax=True, logits=logits))
        return forward_batch(runtimes, calls)

    with_logits, without = run(True), run(False)
    for a, b in zip(with_logits, without):
        assert torch.equal(a.argmax, b.argmax)
        assert torch.equal(a.argmax, greedy_argmax(a.logits))
        assert torch.equal(a.final_hidden, b.final_hidden)
    if FUSED:
        assert all(b.logits is None for b in without)  # the fused head ran: no logits were written
