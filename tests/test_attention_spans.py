"""Attention spans end to end: a token's logits are the same bits whether it is decoded alone, verified in a
chain, verified as a node of a draft tree or read in a prefill chunk, with contexts long enough that rows
read different spans of the cache (sliding windows of 8, spans in 16-slot groups: see
attention_mask.attention_span). On CPUs without the AVX2 attention kernel every row reads the whole cache,
and the same equalities hold."""

from __future__ import annotations

import random

import pytest
import torch

from specdec.models.runtime import ForwardCall, forward_batch

CAPACITY, LENGTH = 340, 330


def _plain_rows(loaded, ids: list[int], prefix: int) -> torch.Tensor:
    """Logits of positions prefix-1 .. len(ids)-1, the prefix read in one chunk, then one token per forward."""
    runtime = loaded.new_runtime()
    runtime.reset(CAPACITY)
    rows = [runtime.prefill(ids[:prefix]).logits]
    for token in ids[prefix:]:
        rows.append(runtime.forward([token]).logits)
        runtime.commit([0])
    return torch.cat(rows)


@pytest.mark.parametrize("model", ["qwen2_sliding", "gemma_untied", "gemma_dim32", "mistral"])
def test_a_token_gets_the_same_logits_in_any_kind_of_forward(zoo, model):
    loaded = zoo.load(model)
    rng = random.Random(7)
    ids = [rng.randrange(3, loaded.vocab_size) for _ in range(LENGTH)]
    plain = _plain_rows(loaded, ids, 40)  # row j: logits after ids[: 40 + j]

    def after(n: int) -> torch.Tensor:  # plain decoding's logits after the first n tokens
        return plain[n - 40]

    # one prefill chunk of 150 rows crossing several span boundaries, every row's logits
    runtime = loaded.new_runtime()
    runtime.reset(CAPACITY)
    runtime.prefill(ids[:100])
    chunk = runtime.forward(ids[100:250]).logits
    assert all(torch.equal(chunk[i], after(101 + i)) for i in range(150))

    # verified chains of 9 rows from many start points, several sequences in one batched forward
    runtimes, calls, starts = [], [], [58, 120, 191, 250, 255, 300, 320]
    for start in starts:
        rt = loaded.new_runtime()
        rt.reset(CAPACITY)
        rt.prefill(ids[:start])
        runtimes.append(rt)
        calls.append(ForwardCall(ids[start : start + 9]))
    for start, result in zip(starts, forward_batch(runtimes, calls)):
        assert all(torch.equal(result.logits[i], after(start + 1 + i)) for i in range(min(9, LENGTH - start)))

    # a tree: the true continuation as one path among random siblings, deep enough to cross a 16-slot group
    runtime = loaded.new_runtime()
    runtime.reset(CAPACITY)
    runtime.prefill(ids[:250])
    tokens, parents, path = [], [], []
    for depth in range(12):
        for _ in range(rng.randrange(0, 3)):  # siblings hanging off the path (or the prefix)
            tokens.append(rng.randrange(3, loaded.vocab_size))
            parents.append(path[-1] if path else -1)
        path.append(len(tokens))
        parents.append(path[-2] if len(path) > 1 else -1)
        tokens.append(ids[250 + depth])
    logits = runtime.forward(tokens, parents).logits
    assert all(torch.equal(logits[node], after(251 + depth)) for depth, node in enumerate(path))
