"""The greedy LM head screened by its int8 copy (kernels/amx_screened_argmax.cpp): every row's token is the one
rows_argmax_linear picks from the bfloat16 head (ties, tails, zero rows, outliers, non-finite rows), only a
few columns are rechecked, and a bound that is too tight would be caught."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.models import fast_linear
from specdec.models.greedy_argmax import fused_greedy_argmax, head_screen

KERNEL = fast_linear.kernel()
SCREENED = hasattr(KERNEL, "amx_screened_argmax") and "amx_int8" in fast_linear._cpu_flags()
pytestmark = pytest.mark.skipif(not SCREENED, reason="the screen needs the AMX kernels and AMX-INT8")


def screened(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return KERNEL.amx_screened_argmax(x, *KERNEL.amx_int8_head(w), w)


def exact(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return KERNEL.rows_argmax_linear(x, w)


@pytest.mark.parametrize("m,k,n", [(1, 640, 4097), (3, 33, 17), (20, 100, 1000), (48, 640, 5000), (70, 96, 333),
                                   (130, 64, 100)])  # tails of rows, columns and k; more than one sweep of 3 m tiles
def test_the_screened_argmax_is_the_bfloat16_heads(m: int, k: int, n: int) -> None:
    torch.manual_seed(m * 7 + n)
    w = (torch.randn(n, k) * 0.05).bfloat16()
    x = (torch.randn(m, k) * 3).bfloat16()
    x[0, 0] = 100.0  # an outlier, as final hidden states have
    got, rechecked = screened(x, w)
    assert torch.equal(got, exact(x, w))
    assert (rechecked >= 1).all()


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 200), n=st.integers(1, 600), spread=st.floats(0.01, 1000.0),
       seed=st.integers(0, 2**31 - 1))
def test_any_shape_and_scale_gives_the_bfloat16_heads_argmax(m: int, k: int, n: int, spread: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = (torch.randn(m, k, generator=g) * torch.rand(m, k, generator=g).pow(8) * spread).bfloat16()
    assert torch.equal(screened(x, w)[0], exact(x, w))


def near_ties(rows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """512 columns that differ from one another by about the int8 copy's step: their estimates misorder."""
    torch.manual_seed(3)
    w = ((torch.randn(1, 256) * 0.05) + torch.randn(512, 256) * 0.001).bfloat16()
    x = (torch.randn(rows, 256) * 2).bfloat16()
    return x, w


def test_columns_the_int8_copy_cannot_tell_apart_are_decided_exactly() -> None:
    x, w = near_ties()
    got, rechecked = screened(x, w)
    assert torch.equal(got, exact(x, w))
    assert (rechecked > 1).any()  # the recheck decided


def test_a_bound_that_is_too_tight_gives_wrong_tokens() -> None:
    """The check above can fail: with the bound's factors zeroed, only the best estimate survives."""
    x, w = near_ties()
    q, scale, c1, c2 = KERNEL.amx_int8_head(w)
    wrong, _ = KERNEL.amx_screened_argmax(x, q, scale, torch.zeros_like(c1), torch.zeros_like(c2), w)
    assert not torch.equal(wrong, exact(x, w))


def test_exact_ties_keep_the_first_column_across_the_threads_ranges() -> None:
    w = (torch.randn(5000, 64) * 0.05).bfloat16()
    w[4900] = w[2500] = 0.5
    x = torch.ones(20, 64).bfloat16()
    assert screened(x, w)[0].tolist() == [2500] * 20 == exact(x, w).tolist()


def test_zero_and_non_finite_rows() -> None:
    w = (torch.randn(300, 64) * 0.05).bfloat16()
    x = torch.randn(4, 64).bfloat16()
    x[1] = 0  # every logit 0: the first column
    x[2, 5] = float("nan")  # left to the bfloat16 kernel
    x[3, 7] = float("inf")
    got, _ = screened(x, w)
    assert torch.equal(got, exact(x, w))
    assert got[1].item() == 0


def test_a_head_with_a_non_finite_weight_is_not_screened() -> None:
    w = torch.randn(100, 32).bfloat16()
    w[10, 3] = float("inf")
    assert KERNEL.amx_int8_head(w) == []
    assert head_screen(w) is None
    x = torch.randn(3, 32).bfloat16()
    assert torch.equal(fused_greedy_argmax(x, w), exact(x, w))


def test_the_screen_follows_the_weight_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(400, 64).bfloat16()
    first = head_screen(w)
    assert first is not None and head_screen(w) is first  # made once
    with torch.no_grad():
        w.mul_(-1)  # an in-place change: a new copy
    assert head_screen(w) is not first
    x = torch.randn(5, 64).bfloat16()
    assert torch.equal(fused_greedy_argmax(x, w), exact(x, w))
    monkeypatch.setenv("SPECDEC_NO_HEAD_SCREEN", "1")
    assert head_screen(w) is None
    assert torch.equal(fused_greedy_argmax(x, w), exact(x, w))


def test_a_model_decodes_the_same_tokens_with_and_without_the_screen(zoo, monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec.api import LLM
    from specdec.sampling_params import SamplingParams

    loaded = zoo.load("gemma_untied")
    assert loaded.decoder.screens_head
    runtime = loaded.new_runtime()
    assert not runtime.scores_head_slices  # screened: every row's argmax at once, no early exit
    prompts = [{"prompt_token_ids": [5 + i, 9, 11, 4 + i]} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}

    def tokens() -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for llm in (LLM(loaded=loaded), LLM(loaded=loaded, speculative_config=spec))
                for o in llm.generate(prompts, params)]

    with_screen = tokens()
    monkeypatch.setenv("SPECDEC_NO_HEAD_SCREEN", "1")
    assert not loaded.decoder.screens_head and runtime.scores_head_slices
    assert tokens() == with_screen


def test_flat_rows_and_huge_weights_go_to_the_bfloat16_head() -> None:
    w = torch.ones(5000, 64).bfloat16()  # every logit equal: no column can be ruled out
    x = torch.randn(40, 64).bfloat16()
    got, rechecked = screened(x, w)
    assert torch.equal(got, exact(x, w)) and (rechecked == 5000).all()  # the whole head decided
    big = torch.randn(100, 32).bfloat16()
    big[3, 3] = 1e7
    assert KERNEL.amx_int8_head(big) == []
