"""Greedy verification over vocabulary slices (verification/greedy_early_exit.py) equals verify_greedy."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from specdec.verification import verify_greedy, verify_tree_greedy
from specdec.verification.greedy_early_exit import slice_bounds, verify_greedy_early_exit


def _scorer(logits: torch.Tensor, calls: list[tuple[int, int, int]] | None = None):
    """head_logits over a fixed logits table; each 'hidden' row holds its row index."""

    def head_logits(hidden: torch.Tensor, columns) -> torch.Tensor:
        if calls is not None and isinstance(columns, slice):
            calls.append((hidden.shape[0], columns.start, columns.stop))
        return logits[hidden[:, 0].long()][:, columns]

    return head_logits


def _maxer(logits: torch.Tensor, calls: list[tuple[int, int, int]]):
    """head_max over the same table, found as a runtime's kernel would: without handing out the logits."""

    def head_max(hidden: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append((hidden.shape[0], columns.start, columns.stop))
        part = logits[hidden[:, 0].long()][:, columns]
        index = part.argmax(-1)
        return part.gather(1, index[:, None])[:, 0], index

    return head_max


def _rows(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32)[:, None]


@settings(max_examples=300, deadline=None)
@given(
    k=st.integers(0, 6),
    vocab=st.integers(2, 70),
    levels=st.integers(1, 5),  # few distinct values: many ties, which argmax breaks by the first index
    seed=st.integers(0, 2**31 - 1),
    follow=st.integers(0, 6),
)
def test_equals_verify_greedy(k, vocab, levels, seed, follow):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (k + 1, vocab), generator=gen).float()
    target = logits.argmax(-1).tolist()
    # the first `follow` draft tokens agree with the target, the rest are random (often a near miss)
    draft = [target[i] if i < follow else int(torch.randint(0, vocab, (), generator=gen)) for i in range(k)]
    want = verify_greedy(draft, logits)
    assert verify_greedy_early_exit(draft, _rows(k + 1), _scorer(logits), vocab) == want
    calls: list[tuple[int, int, int]] = []
    found = verify_greedy_early_exit(draft, _rows(k + 1), _scorer(logits), vocab, head_max=_maxer(logits, calls))
    assert found == want and calls  # the slices went through head_max


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 12),
    vocab=st.integers(2, 40),
    levels=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_trees_equal_verify_tree_greedy(n, vocab, levels, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (n + 1, vocab), generator=gen).float()
    target = logits.argmax(-1).tolist()
    parents: list[int] = []
    draft: list[int] = []
    for i in range(n):  # random shape; a node takes its parent row's argmax half the time (repeats included)
        p = int(torch.randint(-1, i, (), generator=gen)) if i else -1
        parents.append(p)
        agree = bool(torch.rand((), generator=gen) < 0.5)
        draft.append(target[p + 1] if agree else int(torch.randint(0, vocab, (), generator=gen)))
    want = verify_tree_greedy(draft, parents, logits)
    assert verify_greedy_early_exit(draft, _rows(n + 1), _scorer(logits), vocab, parents=parents) == want
    calls: list[tuple[int, int, int]] = []
    found = verify_greedy_early_exit(draft, _rows(n + 1), _scorer(logits), vocab, parents=parents,
                                     head_max=_maxer(logits, calls))
    assert found == want and calls


def test_a_rejected_nodes_subtree_leaves_the_later_slices():
    vocab = 64
    parents = [-1, -1, 1, 0]  # node 1 (token 9) is rejected at the root; node 2 is its child
    draft = [5, 9, 5, 5]
    logits = torch.zeros(len(draft) + 1, vocab)
    logits[:, 5] = 1.0
    calls: list[tuple[int, int, int]] = []
    out = verify_greedy_early_exit(draft, _rows(5), _scorer(logits, calls), vocab, parents=parents)
    assert (out.num_accepted, out.path, out.next_token) == (2, (0, 3), 5)
    assert calls[0][0] == 5 and all(rows == 3 for rows, _, _ in calls[1:])  # root, node 0, node 3


def test_rows_after_a_rejection_leave_the_later_slices():
    vocab, k = 64, 4
    logits = torch.zeros(k + 1, vocab)
    logits[:, 5] = 1.0  # the target wants token 5 everywhere
    draft = [5, 9, 5, 5]  # row 1 rejects: 9 is beaten by token 5 in the first slice
    calls: list[tuple[int, int, int]] = []
    out = verify_greedy_early_exit(draft, _rows(k + 1), _scorer(logits, calls), vocab)
    assert (out.num_accepted, out.next_token) == (1, 5)
    slices = calls
    assert slices[0][0] == k + 1 and all(rows == 2 for rows, _, _ in slices[1:])
    assert [(a, b) for _, a, b in slices] == list(zip(slice_bounds(vocab), slice_bounds(vocab)[1:]))


def test_plain_decoding_scores_the_head_in_one_call():
    logits = torch.randn(1, 50)
    calls: list[tuple[int, int, int]] = []
    out = verify_greedy_early_exit([], _rows(1), _scorer(logits, calls), 50)
    assert out.next_token == int(logits.argmax()) and calls == [(1, 0, 50)]


def test_a_runtime_without_slice_maxima_falls_back_to_the_logits():
    """head_max answering None (a bf16 head, a range starting inside a tile) scores the slice instead."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(3))
    target = logits.argmax(-1).tolist()
    draft = [target[0], (target[1] + 1) % 50]
    calls: list[tuple[int, int, int]] = []
    out = verify_greedy_early_exit(draft, _rows(3), _scorer(logits, calls), 50, head_max=lambda h, c: None)
    assert out == verify_greedy(draft, logits) and calls


def test_slices_cover_the_vocabulary_once():
    for vocab in (2, 17, 262144):
        b = slice_bounds(vocab)
        assert b[0] == 0 and b[-1] == vocab and b == sorted(set(b))


def test_runtime_slices_are_the_whole_heads_numbers(zoo, monkeypatch):
    """The exact runtime scores a vocabulary slice, or a single token, with the same bits as the whole head."""
    from specdec.models.runtime import NativeRuntime

    monkeypatch.setenv("SPECDEC_NO_HEAD_SCREEN", "1")  # screened, greedy verification scores no slices
    target = zoo.load("gemma3_text", "bfloat16")
    runtime = NativeRuntime(target.decoder)
    if not runtime.scores_head_slices:  # no AVX512-BF16 kernel here: the loop must score the whole head
        from specdec.models import fast_linear

        assert fast_linear.kernel() is None
        return
    hidden = torch.randn(5, target.decoder.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    hidden = hidden.to(torch.bfloat16)
    full = target.decoder.logits(hidden)
    vocab = full.shape[1]
    for start, stop in [(0, vocab), (3, 40), (vocab - 7, vocab), (11, 12)]:
        assert torch.equal(runtime.head_logits(hidden, slice(start, stop)), full[:, start:stop])
        assert torch.equal(runtime.head_logits(hidden[2:3], slice(start, stop)), full[2:3, start:stop])
    ids = torch.tensor([7, 0, vocab - 1, 7, 30])
    assert torch.equal(runtime.head_logits(hidden, ids), full[:, ids])
