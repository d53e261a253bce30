"""The greedy LM head's AVX2 screen (kernels/avx2_screened_columns.cpp, models/column_screen.py): the columns
it keeps always include the slice's first maximum, the token and value it returns are those of scoring every
column (ties, slices, zero rows, outliers), non-finite rows fall back, a bound that is too tight would be
caught, and greedy decoding gives the same tokens with the screen and without."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.models import fast_linear
from specdec.models.column_screen import MAX_ROWS, column_screen, screened_max
from specdec.models.greedy_argmax import greedy_argmax

KERNEL = fast_linear.kernel()
pytestmark = pytest.mark.skipif(not hasattr(KERNEL, "screened_columns"), reason="needs the AVX2 kernels")


def exact(x: torch.Tensor, w: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = KERNEL.rows_linear(x, w)[:, start:stop]
    index = greedy_argmax(logits)
    return logits.gather(1, index[:, None])[:, 0], index


def survivors(x: torch.Tensor, w: torch.Tensor, start: int, stop: int, parts=None) -> list[list[int]]:
    columns, offsets = KERNEL.screened_columns(x, *(parts or KERNEL.int8_head_tiles(w)), start, stop)
    return [columns[a:b].tolist() for a, b in zip(offsets.tolist(), offsets[1:].tolist())]


@pytest.mark.parametrize("m,k,n", [(1, 640, 4097), (2, 33, 17), (2, 100, 1000), (5, 640, 5000), (1, 3, 9),
                                   (13, 640, 3000)])
@pytest.mark.parametrize("part", [(0, 1), (1 / 3, 1), (0.1, 0.5)])
def test_the_screen_keeps_the_first_maximum_and_few_others(m: int, k: int, n: int, part: tuple[float, float]) -> None:
    torch.manual_seed(m * 7 + n)
    w = (torch.randn(n, k) * 0.05).bfloat16()
    x = (torch.randn(m, k) * 3).bfloat16()
    x[0, 0] = 100.0  # an outlier, as final hidden states have
    start, stop = int(n * part[0]), max(int(n * part[1]), int(n * part[0]) + 1)
    kept = survivors(x, w, start, stop)
    _, index = exact(x, w, start, stop)
    for row, cols in enumerate(kept):
        assert cols == sorted(cols) and all(start <= c < stop for c in cols)
        assert int(index[row]) + start in cols
        assert len(cols) <= max(16, (stop - start) // 50)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, MAX_ROWS), k=st.integers(1, 200), n=st.integers(1, 600), spread=st.floats(0.01, 1000.0),
       seed=st.integers(0, 2**31 - 1), cut=st.floats(0.0, 0.9))
def test_screened_max_is_the_whole_slices_token_and_value(m: int, k: int, n: int, spread: float, seed: int,
                                                         cut: float) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = (torch.randn(m, k, generator=g) * torch.rand(m, k, generator=g).pow(8) * spread).bfloat16()
    start = int(n * cut)
    got = screened_max(x, w, slice(start, n))
    if got is None:  # flat rows keep most columns: the caller scores the whole slice
        return
    value, index = exact(x, w, start, n)
    assert torch.equal(got[1], index) and torch.equal(got[0], value)


def test_each_rows_columns_are_those_it_gets_alone() -> None:
    """Rows go through the products in blocks of eight sharing each weight load: 19 rows (two full blocks and
    three more, a zero row among them) keep exactly the columns each keeps on its own."""
    torch.manual_seed(5)
    w = (torch.randn(2000, 640) * 0.05).bfloat16()
    x = (torch.randn(19, 640) * torch.rand(19, 640).pow(6) * 20).bfloat16()
    x[7] = 0
    together = survivors(x, w, 100, 1900)
    assert together == [survivors(x[m : m + 1], w, 100, 1900)[0] for m in range(19)]


@pytest.mark.parametrize("k", [640, 3000])
def test_rows_without_outliers_stay_within_int32(k: int) -> None:
    """A row whose elements are all near its largest would sum past int32 at 32767 steps (127 x 640 x 32767 >
    2^31); row_int16 takes a coarser step there, and the screen still gives the whole slice's token."""
    torch.manual_seed(6)
    w = (torch.randn(3000, k) * 0.05).bfloat16()
    x = (torch.full((2, k), 3.0) + torch.rand(2, k) * 0.01).bfloat16()
    x[1] = -x[1]
    x[1, ::2] = 3.0
    got = screened_max(x, w, slice(0, 3000))
    assert got is not None
    value, index = exact(x, w, 0, 3000)
    assert torch.equal(got[1], index) and torch.equal(got[0], value)


def near_ties() -> tuple[torch.Tensor, torch.Tensor]:
    """512 columns that differ from one another by about the int8 copy's step (their estimates misorder)
    among 4,096 that score far lower, so the survivors stay below the share that makes the screen give up."""
    torch.manual_seed(3)
    base = torch.randn(1, 256) * 0.05
    near = base + torch.randn(512, 256) * 0.001
    far = torch.randn(4096, 256) * 0.05
    far -= 2 * base * (far @ base.T) / (base @ base.T)  # reflected away from the rows' direction
    return (torch.randn(2, 256) * 0.1 + base * 40).bfloat16(), torch.cat([far, near]).bfloat16()


def test_columns_the_int8_copy_cannot_tell_apart_are_decided_exactly() -> None:
    x, w = near_ties()
    n = w.shape[0]
    kept = survivors(x, w, 0, n)
    assert all(len(cols) > 1 for cols in kept)
    got = screened_max(x, w, slice(0, n))
    assert got is not None
    assert torch.equal(got[1], exact(x, w, 0, n)[1]) and torch.equal(got[0], exact(x, w, 0, n)[0])


def test_a_bound_that_is_too_tight_is_caught() -> None:
    """The check can fail: without its error terms the screen drops the true maximum of some near-tie row."""
    _, w = near_ties()
    torch.manual_seed(4)
    x = (torch.randn(64, 256) * 0.1 + w[-1:].float() * 40).bfloat16()
    n = w.shape[0]
    q, scale, c1, c2 = KERNEL.int8_head_tiles(w)
    kept = survivors(x, w, 0, n, (q, scale, torch.zeros_like(c1), torch.zeros_like(c2)))
    _, index = exact(x, w, 0, n)
    assert any(int(index[r]) not in cols for r, cols in enumerate(kept))


def test_equal_columns_give_the_first() -> None:
    torch.manual_seed(1)
    w = (torch.randn(300, 64) * 0.1).bfloat16()
    w[200] = w[37] = w[250]  # the same best column three times
    x = (w[250:251].float() * 50).bfloat16()
    got = screened_max(x, w, slice(0, 300))
    assert got is not None and int(got[1][0]) == 37
    got = screened_max(x, w, slice(100, 300))
    assert got is not None and int(got[1][0]) == 100  # column 200, within the slice


def test_zero_rows_pick_the_slices_first_column_and_non_finite_rows_fall_back() -> None:
    w = torch.randn(100, 32).bfloat16()
    got = screened_max(torch.zeros(1, 32).bfloat16(), w, slice(10, 100))
    assert got is not None and int(got[1][0]) == 0 and float(got[0][0]) == 0.0
    bad = torch.zeros(1, 32).bfloat16()
    bad[0, 3] = float("nan")
    assert screened_max(bad, w, slice(0, 100)) is None
    assert screened_max(torch.ones(MAX_ROWS + 1, 32).bfloat16(), w, slice(0, 100)) is None


def test_heads_it_cannot_copy_are_not_screened() -> None:
    w = torch.randn(50, 16).bfloat16()
    w[3, 2] = float("inf")
    assert column_screen(w) is None
    assert column_screen(torch.randn(50, 16)) is None  # float32: not a bfloat16 head
    big = torch.randn(50, 16).bfloat16()
    big[0, 0] = 1e7
    assert KERNEL.int8_head_tiles(big) == []


@pytest.mark.parametrize("model", ["gemma3_text", "wide_llama"])
def test_greedy_decoding_is_the_same_with_the_screen_and_without(zoo, model: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain and n-gram decoding through the engine, one request at a time (a batch's step scores its rows
    with the whole head): the screened head (counted) gives the unscreened tokens."""
    from specdec import LLM, SamplingParams
    from specdec.models import column_screen as screen_module

    loaded = zoo.load(model)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["the cat sat on the mat. the cat sat on the mat. the cat", "hello world"]
    monkeypatch.setenv("SPECDEC_NO_HEAD_SCREEN", "1")
    unscreened = [LLM(loaded=loaded).generate(p, params)[0].outputs[0].token_ids for p in prompts]
    monkeypatch.delenv("SPECDEC_NO_HEAD_SCREEN")
    calls = []
    real = screen_module.screened_max_call

    def counted(*args):
        calls.append(args[0].shape[0])
        return real(*args)

    monkeypatch.setattr(screen_module, "screened_max_call", counted)
    for config in (None, {"method": "ngram", "num_speculative_tokens": 4}):
        llm = LLM(loaded=loaded, speculative_config=config)
        assert [llm.generate(p, params)[0].outputs[0].token_ids for p in prompts] == unscreened
    assert calls and all(1 <= rows <= MAX_ROWS for rows in calls)


def test_a_small_batchs_greedy_tokens_are_screened_and_the_same(zoo, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two requests in one generate call (the batched step asks the decoder for greedy tokens, not logits)."""
    from specdec import LLM, SamplingParams
    from specdec.models import column_screen as screen_module

    loaded = zoo.load("gemma3_text")
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["the cat sat on the mat. the cat", "hello world, hello"]
    monkeypatch.setenv("SPECDEC_NO_HEAD_SCREEN", "1")
    unscreened = [o.outputs[0].token_ids for o in LLM(loaded=loaded).generate(prompts, params)]
    monkeypatch.delenv("SPECDEC_NO_HEAD_SCREEN")
    rows = []
    real = screen_module.screened_max_call
    monkeypatch.setattr(screen_module, "screened_max_call", lambda *a: rows.append(a[0].shape[0]) or real(*a))
    assert [o.outputs[0].token_ids for o in LLM(loaded=loaded).generate(prompts, params)] == unscreened
    assert 2 in rows


def test_screened_max_refuses_a_head_that_does_not_match_its_copy() -> None:
    w = torch.randn(100, 32).bfloat16()
    parts = KERNEL.int8_head_tiles(w)
    x = torch.randn(2, 32).bfloat16()
    with pytest.raises(RuntimeError, match="bfloat16 head"):
        KERNEL.screened_max(x, *parts, 0, 100, w[:, :31].contiguous())
    with pytest.raises(RuntimeError, match="bfloat16 head"):
        KERNEL.screened_max(x, *parts, 0, 100, w.float())


def test_screened_max_reads_a_head_with_any_strides() -> None:
    """A head that is a view (rows further apart than their length, or transposed) gives the contiguous one's."""
    torch.manual_seed(8)
    wide = (torch.randn(300, 48) * 0.1).bfloat16()
    x = (torch.randn(3, 32) * 2).bfloat16()
    for w in (wide[:, :32], wide[:, :32].t().contiguous().t()):
        assert not w.is_contiguous()
        parts = KERNEL.int8_head_tiles(w.contiguous())
        got = KERNEL.screened_max(x, *parts, 20, 300, w)
        want = exact(x, w.contiguous(), 20, 300)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
