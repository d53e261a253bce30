"""Tree verification as pure functions: greedy walks, multi-candidate sampling (exact in distribution), and
cutting trees to a depth."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.drafting.base import Draft
from specdec.drafting.tree import prune_to_depth, tree_depths
from specdec.verification import (
    Verification,
    sample,
    sampling_probs,
    verify_greedy,
    verify_sampling,
    verify_tree_greedy,
    verify_tree_sampling,
)
from specdec.verification.tree import tree_children
from stat_helpers import chi_square_pvalue


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def logits_with_argmax(argmaxes: list[int], vocab: int = 8) -> torch.Tensor:
    logits = torch.randn(len(argmaxes), vocab, generator=gen(len(argmaxes)))
    logits[torch.arange(len(argmaxes)), argmaxes] = 10.0
    return logits


def chain(k: int) -> list[int]:
    return list(range(-1, k - 1))


# --- Verification.path ---------------------------------------------------------------------------------------


def test_chain_results_fill_in_their_path():
    assert Verification(3, 7).path == (0, 1, 2)
    assert Verification(0, 7).path == ()
    assert Verification(2, 7, path=(0, 4)).path == (0, 4)
    with pytest.raises(ValueError, match="path"):
        Verification(2, 7, path=(1,))


# --- greedy --------------------------------------------------------------------------------------------------

#        root
#      /  |   \
#     0:5 1:3  2:5      (node:token; 0 and 2 repeat token 5)
#     |    |     |
#    3:4  4:6   5:4
#    / \
#  6:1 7:2
PARENTS = [-1, -1, -1, 0, 1, 2, 3, 3]
TOKENS = [5, 3, 5, 4, 6, 4, 1, 2]


def tree_argmaxes(path_rows: dict[int, int]) -> list[int]:
    """Target argmax per row (row 0 = root, row i + 1 = node i); rows not given get token 0."""
    return [path_rows.get(r, 0) for r in range(len(TOKENS) + 1)]


def test_greedy_follows_the_matching_child_to_a_leaf_and_adds_a_bonus():
    logits = logits_with_argmax(tree_argmaxes({0: 5, 1: 4, 4: 2, 8: 7}))
    assert verify_tree_greedy(TOKENS, PARENTS, logits) == Verification(3, 7, path=(0, 3, 7))


def test_greedy_takes_the_first_of_repeated_siblings():
    # node 2 also holds 5, and its child 5:4 would match too; the first occurrence (node 0) wins
    logits = logits_with_argmax(tree_argmaxes({0: 5, 1: 3, 3: 4, 6: 0}))
    assert verify_tree_greedy(TOKENS, PARENTS, logits) == Verification(1, 3, path=(0,))


@pytest.mark.parametrize("root_argmax, expected", [(3, (1,)), (7, ())])
def test_greedy_stops_where_no_child_matches(root_argmax, expected):
    logits = logits_with_argmax(tree_argmaxes({0: root_argmax, 2: 1}))
    out = verify_tree_greedy(TOKENS, PARENTS, logits)
    assert out.path == expected and out.num_accepted == len(expected)
    assert out.next_token == (1 if expected else 7)


def test_greedy_on_a_chain_equals_verify_greedy():
    for seed in range(50):
        g = gen(seed)
        k = int(torch.randint(0, 6, (), generator=g))
        logits = torch.randn(k + 1, 4, generator=g)
        draft = torch.randint(4, (k,), generator=g).tolist()
        assert verify_tree_greedy(draft, chain(k), logits) == verify_greedy(draft, logits)


def test_empty_tree_is_plain_argmax():
    assert verify_tree_greedy([], [], logits_with_argmax([6])) == Verification(0, 6)
    assert verify_tree_sampling([], [], None, torch.tensor([[0.0, 1.0]]), gen(0)) == Verification(0, 1)


def test_malformed_trees_are_rejected():
    logits = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="parent"):
        verify_tree_greedy([1, 2, 3], [-1, 2, 0], logits)  # a parent after its child
    with pytest.raises(ValueError, match="parent"):
        verify_tree_greedy([1, 2, 3], [-1, -2, 0], logits)
    with pytest.raises(ValueError, match="parents"):
        verify_tree_greedy([1, 2, 3], [-1, 0], logits)
    with pytest.raises(ValueError, match="rows of target logits"):
        verify_tree_greedy([1, 2], [-1, -1], logits)
    with pytest.raises(ValueError, match="rows of draft"):
        verify_tree_sampling([1, 2, 3], [-1, -1, 0], torch.full((2, 8), 0.125), torch.full((4, 8), 0.125), gen(0))


def test_tree_children_lists_children_per_row_in_draft_order():
    assert tree_children(PARENTS) == [[0, 1, 2], [3], [4], [5], [6, 7], [], [], [], []]


# --- sampling: unit cases ------------------------------------------------------------------------------------


def test_sampling_on_a_chain_equals_verify_sampling_draw_for_draw():
    for seed in range(200):
        g = gen(seed)
        k = int(torch.randint(0, 5, (), generator=g))
        p = sampling_probs(torch.randn(k + 1, 6, generator=g) * 2, 1.0)
        q = sampling_probs(torch.randn(k, 6, generator=g) * 2, 1.0)
        draft = torch.multinomial(q, 1, generator=g)[:, 0].tolist() if k else []
        for probs in (q, None):
            assert verify_tree_sampling(draft, chain(k), probs, p, gen(seed)) == verify_sampling(
                draft, probs, p, gen(seed)
            )


def test_point_mass_siblings_are_sampling_without_replacement():
    # root children 1, 2: P(keep 1) = 0.5, P(keep 2) = 0.3 (0.5 * 0.3/0.5), else token 0 (0.2)
    p = torch.tensor([[0.2, 0.5, 0.3], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    n = 6000
    outs = [verify_tree_sampling([1, 2], [-1, -1], None, p, gen(seed)) for seed in range(n)]
    counts = np.bincount([o.path[0] + 1 if o.path else 0 for o in outs], minlength=3)
    assert chi_square_pvalue(counts, np.array([0.2, 0.5, 0.3])) > 1e-4
    assert all(o.next_token == 0 for o in outs if not o.path)  # the residual excludes both tried tokens
    assert all(o.next_token == (0 if o.path == (0,) else 1) for o in outs if o.path)  # bonus from the kept row


def test_repeated_point_mass_siblings_are_tried_once():
    # children [1, 1, 2]: the second 1 never gets a chance, and never consumes probability
    p = torch.tensor([[0.2, 0.5, 0.3], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    outs = [verify_tree_sampling([1, 1, 2], [-1, -1, -1], None, p, gen(seed)) for seed in range(3000)]
    assert {o.path for o in outs} == {(), (0,), (2,)}
    assert stats.binomtest(sum(o.path == (2,) for o in outs), 3000, 0.3).pvalue > 1e-3


def test_iid_siblings_use_the_running_residual():
    # q = p: the first child is always accepted
    p = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.5, 0.5]])
    q = p[[0, 0]].clone()
    for seed in range(100):
        assert verify_tree_sampling([0, 1], [-1, -1], q, p, gen(seed)).path[0] == 0
    # q = (1, 0), p = (0.5, 0.5): child 0 (token 0) is kept half the time; after a rejection the residual is
    # all on token 1, which a second child drawing token 0 can never match, so the next token is 1
    p = torch.tensor([[0.5, 0.5], [0.0, 1.0], [0.0, 1.0]])
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    outs = [verify_tree_sampling([0, 0], [-1, -1], q, p, gen(seed)) for seed in range(2000)]
    assert {o.path for o in outs} == {(), (0,)}
    assert {o.next_token for o in outs if not o.path} == {1}
    assert stats.binomtest(sum(bool(o.path) for o in outs), 2000, 0.5).pvalue > 1e-3


@pytest.mark.parametrize("point_mass", [True, False])
def test_emitted_tokens_stay_in_the_warped_support(point_mass):
    vocab = 10
    for seed in range(300):
        g = gen(seed)
        tokens, parents, probs = random_tree(g, vocab, point_mass)
        p = sampling_probs(torch.randn(len(tokens) + 1, vocab, generator=g) * 2, 0.9, 4, 0.8)
        out = verify_tree_sampling(tokens, parents, probs, p, g)
        rows = [0, *(i + 1 for i in out.path)]
        for row, token in zip(rows, [*(tokens[i] for i in out.path), out.next_token]):
            assert p[row, token] > 0, (seed, row, token)


def random_tree(g: torch.Generator, vocab: int, point_mass: bool, size: int = 12):
    parents = [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, size)]
    q = sampling_probs(torch.randn(size + 1, vocab, generator=g) * 2, 0.9, 4, 0.8)  # row r + 1 = below node r
    rows = q[[p + 1 for p in parents]]
    tokens = torch.multinomial(rows, 1, generator=g)[:, 0].tolist()
    return tokens, parents, None if point_mass else rows


def test_seeded_tree_verification_is_reproducible():
    cases = []
    for seed in range(50):
        g = gen(seed)
        tokens, parents, probs = random_tree(g, 6, seed % 2 == 0)
        cases.append((tokens, parents, probs, sampling_probs(torch.randn(len(tokens) + 1, 6, generator=g), 1.0)))
    first = [verify_tree_sampling(*c, gen(7)) for c in cases]
    assert first == [verify_tree_sampling(*c, gen(7)) for c in cases]
    assert first != [verify_tree_sampling(*c, gen(8)) for c in cases]


# --- sampling: exactness in distribution ---------------------------------------------------------------------

VOCAB = 6


class TreeBigramProcess:
    """Target and draft given by bigram tables (warped like the engine warps them), decoded by drafting a
    tree below the last token and verifying it, as the engine does.

    Trees: `widths[d]` children under every node of depth d. Kinds: "topk" (the draft's top tokens, point
    masses), "iid" (i.i.d. samples from the draft, with probs), "repeat" (point masses repeating the draft's
    argmax among other tokens: duplicate siblings)."""

    def __init__(self, seed: int, widths: tuple[int, ...], kind: str, temperature=1.0, top_k=0, top_p=1.0):
        g = gen(seed)
        target_logits = torch.randn(VOCAB, VOCAB, generator=g) * 1.5
        draft_logits = target_logits + torch.randn(VOCAB, VOCAB, generator=g) * 1.5
        self.p = sampling_probs(target_logits, temperature, top_k, top_p)  # [prev, next]
        self.q = sampling_probs(draft_logits, temperature, top_k, top_p)
        self.widths, self.kind = widths, kind
        self.accepted = self.steps = 0

    def exact_joint(self, length: int) -> np.ndarray:
        p = self.p.double().numpy()
        joint = p[0]
        for _ in range(length - 1):
            joint = joint[..., None] * p
        return joint

    def children(self, token: int, width: int, g: torch.Generator) -> list[int]:
        if self.kind == "iid":
            return torch.multinomial(self.q[token], width, replacement=True, generator=g).tolist()
        ranked = torch.argsort(self.q[token], descending=True).tolist()
        if self.kind == "topk":
            return ranked[:width]
        return [ranked[0], ranked[2], ranked[0], ranked[1]][:width]  # "repeat"

    def draft(self, last: int, g: torch.Generator):
        tokens, parents, frontier = [], [], [(-1, last)]
        for width in self.widths:
            nxt = []
            for node, token in frontier:
                for child in self.children(token, width, g):
                    tokens.append(child)
                    parents.append(node)
                    nxt.append((len(tokens) - 1, child))
            frontier = nxt
        if self.kind != "iid":
            return tokens, parents, None
        return tokens, parents, self.q[[last if p < 0 else tokens[p] for p in parents]]  # row i: below i's parent

    def generate(self, length: int, g: torch.Generator, verify=verify_tree_sampling) -> list[int]:
        out: list[int] = []
        last = 0
        while len(out) < length:
            tokens, parents, probs = self.draft(last, g)
            result = verify(tokens, parents, probs, self.p[[last, *tokens]], g)
            self.steps += 1
            self.accepted += result.num_accepted
            out += [*(tokens[i] for i in result.path), result.next_token]
            last = out[-1]
        return out[:length]


def assert_follows_target(process: TreeBigramProcess, samples: np.ndarray) -> None:
    length = samples.shape[1]
    joint = process.exact_joint(length)
    for i in range(length):
        marginal = joint.sum(axis=tuple(j for j in range(length) if j != i))
        assert chi_square_pvalue(np.bincount(samples[:, i], minlength=VOCAB), marginal) > 1e-4, f"position {i}"
    for i in range(length - 1):
        pair = joint.sum(axis=tuple(j for j in range(length) if j not in (i, i + 1)))
        observed = np.bincount(samples[:, i] * VOCAB + samples[:, i + 1], minlength=VOCAB * VOCAB)
        assert chi_square_pvalue(observed, pair) > 1e-4, f"positions {i}, {i + 1}"


TREE_CASES = [
    ((3, 2), "topk", (1.0, 0, 1.0)),
    ((2, 2, 1), "iid", (1.0, 0, 1.0)),
    ((3, 1), "iid", (0.8, 4, 0.9)),
    ((4, 2), "repeat", (0.8, 4, 0.9)),
    ((1, 3), "topk", (0.8, 4, 0.9)),
]


@pytest.mark.parametrize("widths, kind, warp", TREE_CASES)
def test_tree_sampling_reproduces_the_target_distribution(widths, kind, warp):
    """Every position (inside the first tree's path, at its next token, and in later steps) and every pair of
    neighbours is distributed as sampling from the target alone."""
    process = TreeBigramProcess(20 + len(widths), widths, kind, *warp)
    length, n, g = len(widths) + 2, 10000, gen(len(widths))
    samples = np.array([process.generate(length, g) for _ in range(n)])
    rate = process.accepted / (process.steps * len(widths))
    assert 0.1 < rate < 0.95, rate  # both accepted paths and rejections are exercised
    assert_follows_target(process, samples)


def wrong_tree_verifier(mistake: str):
    """verify_tree_sampling with one classic mistake. "resample_from_p": when no child is kept, sample the
    target's p itself instead of the residual. "fixed_p": test every sibling against the untouched p instead
    of the residual left by the siblings before it."""

    def verify(tokens, parents, probs, target_probs, generator):
        children = tree_children(parents)
        path, row = [], 0
        while True:
            p = original = target_probs[row]
            accepted = None
            for node in children[row]:
                x = tokens[node]
                q = 1.0 if probs is None else float(probs[node, x])
                tested = original if mistake == "fixed_p" else p
                if float(torch.rand((), generator=generator, dtype=torch.float64)) * q < float(tested[x]):
                    accepted = node
                    break
                residual = p.index_fill(0, torch.tensor([x]), 0.0) if probs is None else (p - probs[node]).clamp(min=0)
                if residual.sum() > 0:
                    p = residual / residual.sum()
            if accepted is None:
                final = original if mistake == "resample_from_p" else p
                return Verification(len(path), sample(final, generator), tuple(path))
            path.append(accepted)
            row = accepted + 1

    return verify


@pytest.mark.parametrize("kind, mistake", [("topk", "resample_from_p"), ("iid", "fixed_p")])
def test_the_statistical_test_detects_a_wrong_tree_verifier(kind, mistake):
    """The distribution test above must be able to fail."""
    process = TreeBigramProcess(22, (3, 2), kind)
    length, n, g = 4, 10000, gen(0)
    samples = np.array([process.generate(length, g, verify=wrong_tree_verifier(mistake)) for _ in range(n)])
    joint = process.exact_joint(length)
    pvalues = [
        chi_square_pvalue(
            np.bincount(samples[:, i], minlength=VOCAB), joint.sum(axis=tuple(j for j in range(length) if j != i))
        )
        for i in range(length)
    ]
    assert min(pvalues) < 1e-6, pvalues


# --- cutting a tree to a depth -------------------------------------------------------------------------------


def test_tree_depths():
    assert tree_depths(PARENTS) == [1, 1, 1, 2, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="parent"):
        tree_depths([-1, 1])


@pytest.mark.parametrize("max_depth, kept", [(0, []), (1, [0, 1, 2]), (2, [0, 1, 2, 3, 4, 5]), (3, list(range(8)))])
def test_prune_to_depth_drops_deeper_nodes_and_remaps_parents(max_depth, kept):
    probs = torch.rand(len(TOKENS), 8, generator=gen(0))
    draft = Draft(tokens=TOKENS, probs=probs, parents=PARENTS)
    pruned, kept_out = prune_to_depth(draft, max_depth)
    assert kept_out == kept
    assert pruned.tokens == [TOKENS[i] for i in kept]
    assert torch.equal(pruned.probs, probs[kept])
    for j, old in enumerate(kept):  # each kept node keeps its (renumbered) parent
        assert (pruned.parents[j] < 0 and PARENTS[old] < 0) or kept[pruned.parents[j]] == PARENTS[old]
    if max_depth >= 3:
        assert pruned is draft


def test_prune_to_depth_keeps_topological_order_when_deep_nodes_come_early():
    # DFS order: a deep branch first, then a shallow sibling of its root
    draft = Draft(tokens=[10, 11, 12, 13, 14], parents=[-1, 0, 1, -1, 3])
    pruned, kept = prune_to_depth(draft, 2)
    assert (pruned.tokens, pruned.parents, kept) == ([10, 11, 13, 14], [-1, 0, -1, 2], [0, 1, 3, 4])
    assert pruned.probs is None
    with pytest.raises(ValueError, match="tree"):
        prune_to_depth(Draft(tokens=[1]), 1)


def test_prune_to_depth_keeps_the_first_nodes_within_a_node_budget():
    draft = Draft(tokens=[10, 11, 12, 13, 14], parents=[-1, -1, 0, 2, 1])
    pruned, kept = prune_to_depth(draft, 3, max_nodes=3)
    assert kept == [0, 1, 2] and pruned.tokens == [10, 11, 12] and pruned.parents == [-1, -1, 0]
    pruned, kept = prune_to_depth(draft, 1, max_nodes=3)  # the depth cut first, then the budget
    assert kept == [0, 1] and pruned.parents == [-1, -1]
    assert prune_to_depth(draft, 3, max_nodes=0)[1] == []
