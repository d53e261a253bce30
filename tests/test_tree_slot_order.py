"""Draft-tree rows read their ancestors in chain slot order, so a tree node's logits and KV are bit-identical
to the same token decoded in a chain (the float sums over the cache group their terms the same way)."""

from __future__ import annotations

import random

import torch
from specdec.models.attention_mask import build_mask, reorder_mask, tree_ancestry, tree_slot_order


def test_slot_order_puts_ancestors_at_chain_slots():
    parents = [-1, 0, 0, 1, 2, -1]
    ancestry, depth = tree_ancestry(parents, torch.device("cpu"))
    order = tree_slot_order(ancestry, committed=3, capacity=12)
    assert order[:, :3].tolist() == [[0, 1, 2]] * 6
    assert order[4, 3:6].tolist() == [3, 5, 7]  # node 4: root 0 (slot 3), node 2 (slot 5), itself (slot 7)
    assert order[5, 3].item() == 8  # a second root reads itself at the first pending column
    assert order[4, 6:].tolist() == list(range(6, 12))  # columns past its depth: themselves (masked)
    positions = torch.arange(12)
    mask = build_mask(positions, 3, ancestry, 3 + depth, None)
    chain = reorder_mask(mask, order, depth, 3)
    assert chain[4].tolist() == [True] * 6 + [False] * 6  # committed + its 3-token path, as a chain would see
    assert chain[5].tolist() == [True] * 4 + [False] * 8


def test_tree_rows_equal_chain_rows_bitwise(zoo):
    for family in ("llama", "gemma3_text", "qwen2_sliding"):
        model = zoo.load(family)
        rng = random.Random(0)
        prompt = [rng.randrange(3, model.vocab_size) for _ in range(9)]
        for trial in range(6):
            n = rng.randrange(3, 12)
            parents = [-1] + [rng.randrange(-1, i) for i in range(1, n)]
            tokens = [rng.randrange(3, model.vocab_size) for _ in range(n)]
            tree_rt = model.new_runtime()
            tree_rt.reset(64)
            tree_rt.forward(prompt)
            tree_rt.commit(range(len(prompt)))
            tree = tree_rt.forward(tokens, parents=parents).logits
            for leaf in range(n):
                path, p = [], leaf
                while p != -1:
                    path.append(p)
                    p = parents[p]
                path.reverse()
                chain_rt = model.new_runtime()
                chain_rt.reset(64)
                chain_rt.forward(prompt)
                chain_rt.commit(range(len(prompt)))
                chain = chain_rt.forward([tokens[i] for i in path]).logits
                for row, node in enumerate(path):
                    assert torch.equal(chain[row], tree[node]), (family, trial, parents, node)
