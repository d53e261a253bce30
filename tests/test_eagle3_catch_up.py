"""EAGLE-3 reads committed positions only when it drafts: a request given no draft costs no drafter work, and
a long backlog (a prompt, many steps without a draft) is read in chunks before the draft, the same way by
`propose` and `propose_batch`."""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.drafting import eagle3
from specdec.drafting.pending_features import PendingFeatures


def _hidden(rows: int, seed: int) -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {i: torch.randn(rows, 4, generator=g).to(torch.bfloat16) for i in (1, 3, 5)}


def test_pending_features_gather_what_was_added_in_order():
    pending = PendingFeatures((1, 3, 5))
    parts = [(_hidden(6, s), rows) for s, rows in enumerate([None, [0, 2], [1], [0, 1, 2, 3]])]
    for hidden, rows in parts:
        pending.add(hidden, rows)
    pending.add(_hidden(3, 9), [])  # nothing committed: nothing pending
    expected = torch.cat([torch.cat([h[i] if r is None else h[i][r] for i in (1, 3, 5)], dim=-1) for h, r in parts])
    assert len(pending) == expected.shape[0] == 13
    assert torch.equal(pending.take(5), expected[:5])
    assert len(pending) == 8
    assert torch.equal(pending.take(), expected[5:])
    assert len(pending) == 0
    with pytest.raises(ValueError):
        pending.take(1)


def test_pending_features_hold_at_most_max_parts_forwards():
    from specdec.drafting.pending_features import MAX_PARTS

    pending = PendingFeatures((1, 3, 5))
    parts = [_hidden(2, s) for s in range(2 * MAX_PARTS + 3)]
    for h in parts:
        pending.add(h, [1])
    assert len(pending._parts) <= MAX_PARTS + 1  # gathered into one tensor once past MAX_PARTS
    expected = torch.cat([torch.cat([h[i][[1]] for i in (1, 3, 5)], dim=-1) for h in parts])
    assert torch.equal(pending.take(), expected)


def _llm(zoo, tmp_path, **config) -> LLM:
    from eagle3_helpers import make_random_eagle3

    target = zoo.load("gemma3_text")
    path = make_random_eagle3(target, tmp_path / "d", draft_vocab_size=200)
    return LLM(loaded=target, speculative_config={"method": "eagle3", "model": path, **config})


def _count_drafter_rows(monkeypatch, llm: LLM) -> list[int]:
    rows: list[int] = []
    cls = type(llm.new_proposer().drafter)
    real = cls.step_batch
    monkeypatch.setattr(cls, "step_batch", lambda self, h, *a: rows.append(h.shape[0]) or real(self, h, *a))
    return rows


def test_a_request_given_no_draft_costs_no_drafter_work(zoo, tmp_path, monkeypatch):
    llm = _llm(zoo, tmp_path, num_speculative_tokens=4, num_speculative_tokens_by_batch_size=[[1, 64, 0]])
    rows = _count_drafter_rows(monkeypatch, llm)
    prompts = [[5, 6, 7, 8, 9] * 8, [3, 1, 4, 1, 5, 9, 2, 6]]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=12))
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    assert rows == [] and llm.stats.num_draft_tokens == 0


@pytest.mark.parametrize("tree", [False, True])
def test_a_long_backlog_is_read_in_chunks_then_drafted_as_alone(zoo, tmp_path, monkeypatch, tree):
    """Prompts longer than CATCH_UP_ROWS: catch_up_batch reads all but their last position, PROMPT_CHUNK at a
    time for every proposer together; the drafts then equal each proposer's own `propose`, and greedy
    decoding through the scheduler still equals plain decoding."""
    monkeypatch.setattr(eagle3, "PROMPT_CHUNK", 8)
    extra = {"tree_top_k": 2, "tree_num_draft_tokens": 6} if tree else {}
    llm = _llm(zoo, tmp_path, num_speculative_tokens=3, **extra)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    contexts = [list(range(3, 3 + 29)), [7, 8, 9] * 7, [4, 2]]  # 29 and 21 positions pending; 2: none to catch up
    tokens = [[*c, 11] for c in contexts]

    def begun() -> list:
        ps = [llm.new_proposer() for _ in contexts]
        for i, (p, c) in enumerate(zip(ps, contexts)):
            runtime = llm.model.new_runtime()
            runtime.reset(64)
            p.begin(c, params, torch.Generator().manual_seed(i), 64, runtime.prefill(c, capture=p.target_layers))
        return ps

    alone = [p.propose(t, 3) for p, t in zip(begun(), tokens)]
    batched = begun()
    rows = _count_drafter_rows(monkeypatch, llm)
    eagle3.Eagle3Proposer.catch_up_batch(batched, tokens)
    # 28 = 8 + 8 + 8 + 4 and 20 = 8 + 8 + 4 positions to read, a chunk of each per drafter step
    assert rows == [16, 16, 12, 4]
    assert [len(p.pending) for p in batched] == [1, 1, 2]
    together = eagle3.Eagle3Proposer.propose_batch(batched, tokens, [3, 3, 3])
    assert [d.tokens for d in together] == [d.tokens for d in alone]
    assert [d.parents for d in together] == [d.parents for d in alone]

    plain = LLM(loaded=llm.model)
    prompts = [{"prompt_token_ids": c} for c in contexts]
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    assert llm.stats.num_draft_tokens > 0 and llm.stats.catch_up_seconds > 0
