"""Verification as pure functions: greedy, speculative sampling (exactness in distribution), warping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.verification import Verification, sampling_probs, verify_greedy, verify_sampling
from stat_helpers import chi_square_pvalue

# --- sampling_probs: temperature, then top-k, then top-p ----------------------------------------------------


def test_temperature_divides_logits():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    torch.testing.assert_close(sampling_probs(logits, 0.5), torch.softmax(logits / 0.5, -1))
    torch.testing.assert_close(sampling_probs(logits, 1.0), torch.softmax(logits, -1))


def test_temperature_zero_is_rejected():
    with pytest.raises(ValueError, match="greedy"):
        sampling_probs(torch.zeros(1, 4), 0.0)


def test_top_k_keeps_the_k_largest_renormalized():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0, -1.0]])
    probs = sampling_probs(logits, 1.0, top_k=2)
    expected = torch.zeros(1, 5)
    expected[0, [1, 2]] = torch.softmax(torch.tensor([3.0, 2.0]), -1)
    torch.testing.assert_close(probs, expected)


def test_top_k_keeps_ties_with_the_kth():
    probs = sampling_probs(torch.tensor([[3.0, 2.0, 2.0, 0.0]]), 1.0, top_k=2)
    assert (probs[0] > 0).tolist() == [True, True, True, False]


def test_top_k_at_least_vocab_is_no_filter():
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_k=6), torch.softmax(logits, -1))
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_k=0), torch.softmax(logits, -1))


@pytest.mark.parametrize(
    "top_p, kept", [(0.4, [0]), (0.7, [0, 1]), (0.85, [0, 1, 2]), (0.99, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])]
)
def test_top_p_keeps_the_smallest_set_reaching_top_p(top_p, kept):
    base = torch.tensor([0.5, 0.3, 0.15, 0.05])
    probs = sampling_probs(base.log()[None], 1.0, top_p=top_p)[0]
    expected = torch.zeros(4)
    expected[kept] = base[kept] / base[kept].sum()
    torch.testing.assert_close(probs, expected)


def test_top_p_is_applied_after_top_k():
    # top-k 2 renormalizes [0.4, 0.3] to [4/7, 3/7]; top-p 0.5 then keeps only the first. (top-p first would keep two.)
    base = torch.tensor([0.4, 0.3, 0.2, 0.1])
    probs = sampling_probs(base.log()[None], 1.0, top_k=2, top_p=0.5)[0]
    torch.testing.assert_close(probs, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_rows_are_warped_independently():
    logits = torch.randn(5, 10, generator=torch.Generator().manual_seed(1))
    together = sampling_probs(logits, 0.7, top_k=4, top_p=0.8)
    for i in range(5):
        torch.testing.assert_close(together[i], sampling_probs(logits[i : i + 1], 0.7, top_k=4, top_p=0.8)[0])
        assert (together[i] > 0).sum() <= 4
        torch.testing.assert_close(together[i].sum(), torch.tensor(1.0))


# --- greedy ------------------------------------------------------------------------------------------------


def one_hot_logits(argmaxes: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.randn(len(argmaxes), vocab, generator=torch.Generator().manual_seed(len(argmaxes)))
    logits[torch.arange(len(argmaxes)), argmaxes] = 10.0
    return logits


def test_greedy_all_accepted_gives_a_bonus_token():
    logits = one_hot_logits([3, 1, 4, 5])
    assert verify_greedy([3, 1, 4], logits) == Verification(num_accepted=3, next_token=5)


@pytest.mark.parametrize("mismatch", [0, 1, 2])
def test_greedy_stops_at_the_first_mismatch(mismatch):
    target = [3, 1, 4, 5]
    draft = target[:3]
    draft[mismatch] = 0
    draft_after = [*draft]
    out = verify_greedy(draft, one_hot_logits(target))
    assert out == Verification(num_accepted=mismatch, next_token=target[mismatch])
    assert draft == draft_after  # not modified


def test_greedy_later_matches_after_a_mismatch_do_not_count():
    assert verify_greedy([0, 1, 4], one_hot_logits([3, 1, 4, 5])).num_accepted == 0


def test_greedy_empty_draft_is_plain_argmax():
    assert verify_greedy([], one_hot_logits([2])) == Verification(num_accepted=0, next_token=2)


def test_greedy_needs_k_plus_one_rows():
    with pytest.raises(ValueError, match="rows"):
        verify_greedy([1, 2], one_hot_logits([1, 2]))


# --- speculative sampling: unit cases ----------------------------------------------------------------------


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_sampling_accepts_everything_when_draft_equals_target():
    p = torch.softmax(torch.randn(4, 8, generator=gen(0)), -1)
    for seed in range(200):
        draft = torch.multinomial(p[:3], 1, generator=gen(1000 + seed))[:, 0].tolist()
        out = verify_sampling(draft, p[:3].clone(), p, gen(seed))
        assert out.num_accepted == 3
        assert p[3, out.next_token] > 0


def test_sampling_never_accepts_a_token_the_target_excludes():
    p = torch.tensor([[0.0, 0.6, 0.4], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.5, 0.25, 0.25]])
    for seed in range(200):
        out = verify_sampling([0], q, p, gen(seed))
        assert out.num_accepted == 0
        assert out.next_token in (1, 2)
        out = verify_sampling([0], None, p, gen(seed))  # point mass
        assert out.num_accepted == 0 and out.next_token in (1, 2)


def test_point_mass_draft_is_accepted_with_the_target_probability():
    p = torch.tensor([[0.3, 0.7, 0.0], [0.2, 0.3, 0.5]])
    n = 4000
    outs = [verify_sampling([1], None, p, gen(seed)) for seed in range(n)]
    accepted = sum(o.num_accepted for o in outs)
    assert stats.binomtest(accepted, n, 0.7).pvalue > 1e-3
    rejected_next = {o.next_token for o in outs if o.num_accepted == 0}
    assert rejected_next == {0}  # p with the draft token removed, renormalized: all mass on token 0
    bonus = np.bincount([o.next_token for o in outs if o.num_accepted == 1], minlength=3)
    assert bonus[0] > 0 and bonus[1] > 0 and bonus[2] > 0  # the bonus token comes from row 1


def test_point_mass_draft_with_target_probability_one_is_always_accepted():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    assert all(verify_sampling([1], None, p, gen(seed)).num_accepted == 1 for seed in range(100))


def test_rejection_resamples_from_the_residual():
    # accept token 0 with probability p/q = 0.5; the residual (p - q)+ is all on token 1
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    n = 4000
    outs = [verify_sampling([0], q, p, gen(seed)) for seed in range(n)]
    accepted = [o for o in outs if o.num_accepted == 1]
    rejected = [o for o in outs if o.num_accepted == 0]
    assert stats.binomtest(len(accepted), n, 0.5).pvalue > 1e-3
    assert {o.next_token for o in accepted} == {2}  # the bonus comes from row 1
    assert {o.next_token for o in rejected} == {1}


def test_tokens_the_draft_overproposes_are_accepted_with_probability_p_over_q():
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    q = torch.tensor([[0.8, 0.2]])
    n = 4000
    accepted = sum(verify_sampling([0], q, p, gen(seed)).num_accepted for seed in range(n))
    assert stats.binomtest(accepted, n, 0.25).pvalue > 1e-3
    # and an underproposed token is always accepted (p/q >= 1)
    assert all(verify_sampling([1], q, p, gen(seed)).num_accepted == 1 for seed in range(200))


def test_empty_draft_samples_the_first_row():
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    assert verify_sampling([], None, p, gen(0)) == Verification(num_accepted=0, next_token=2)
    assert verify_sampling([], torch.zeros(0, 4), p, gen(0)) == Verification(num_accepted=0, next_token=2)


def test_sampling_shape_errors():
    p = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="target"):
        verify_sampling([1], None, p, gen(0))
    with pytest.raises(ValueError, match="draft"):
        verify_sampling([1, 2], torch.full((1, 4), 0.25), p, gen(0))


def random_case(seed: int, k: int = 3, vocab: int = 10):
    g = gen(seed)
    p = sampling_probs(torch.randn(k + 1, vocab, generator=g) * 2, 1.0)
    q = sampling_probs(torch.randn(k, vocab, generator=g) * 2, 1.0)
    draft = torch.multinomial(q, 1, generator=g)[:, 0].tolist()
    return draft, q, p


def test_seeded_verification_is_reproducible():
    cases = [random_case(seed) for seed in range(50)]
    first = [verify_sampling(d, q, p, gen(7)) for d, q, p in cases]
    again = [verify_sampling(d, q, p, gen(7)) for d, q, p in cases]
    other = [verify_sampling(d, q, p, gen(8)) for d, q, p in cases]
    assert first == again
    assert first != other


def test_one_generator_drives_a_sequence_of_steps_reproducibly():
    def run(seed):
        g = gen(seed)
        return [verify_sampling(d, q, p, g) for d, q, p in (random_case(s) for s in range(30))]

    assert run(3) == run(3)


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (0, 0.6), (4, 0.8)])
@pytest.mark.parametrize("point_mass", [False, True])
def test_emitted_tokens_stay_in_the_warped_support(top_k, top_p, point_mass):
    vocab, k = 10, 3
    for seed in range(300):
        g = gen(seed)
        p = sampling_probs(torch.randn(k + 1, vocab, generator=g) * 2, 0.9, top_k, top_p)
        q = sampling_probs(torch.randn(k, vocab, generator=g) * 2, 0.9, top_k, top_p)
        if point_mass:  # e.g. an n-gram draft: any token, even one outside the target's support
            draft, q = torch.randint(vocab, (k,), generator=g).tolist(), None
        else:
            draft = torch.multinomial(q, 1, generator=g)[:, 0].tolist()
        out = verify_sampling(draft, q, p, g)
        emitted = [*draft[: out.num_accepted], out.next_token]
        for i, token in enumerate(emitted):
            assert p[i, token] > 0, (seed, i, token)


# --- speculative sampling: exactness in distribution --------------------------------------------------------

VOCAB = 8


class BigramProcess:
    """A target and a draft 'model' given by bigram tables (next-token distribution given the previous token),
    warped like the engine warps them, and a loop that decodes with verify_sampling as the engine does."""

    def __init__(self, seed: int, temperature: float, top_k: int, top_p: float, vocab: int = VOCAB) -> None:
        g = gen(seed)
        target_logits = torch.randn(vocab, vocab, generator=g) * 1.5
        draft_logits = target_logits + torch.randn(vocab, vocab, generator=g) * 1.5  # related, not equal
        self.p = sampling_probs(target_logits, temperature, top_k, top_p)  # [prev, next]
        self.q = sampling_probs(draft_logits, temperature, top_k, top_p)
        self.q_cum = np.cumsum(self.q.double().numpy(), axis=1)
        self.q_argmax = self.q.argmax(dim=1).tolist()
        self.vocab = vocab
        self.start = 0
        self.accepted = 0
        self.drafted = 0

    def exact_joint(self, length: int) -> np.ndarray:
        """P(x_1..x_length) as an array of shape [vocab] * length."""
        p = self.p.double().numpy()
        joint = p[self.start]
        for _ in range(length - 1):
            joint = joint[..., None] * p  # [..., a, b] = P(..., a) * p(b | a)
        return joint

    def generate(
        self, length: int, k: int, point_mass: bool, rng: np.random.Generator, g: torch.Generator,
        verify=verify_sampling,
    ) -> list[int]:
        out: list[int] = []
        last = self.start
        while len(out) < length:
            draft, prev = [], last
            for _ in range(k):
                if point_mass:  # deterministic draft (argmax of q): q is a point mass
                    token = self.q_argmax[prev]
                else:
                    token = min(int(np.searchsorted(self.q_cum[prev], rng.random(), side="right")), self.vocab - 1)
                draft.append(token)
                prev = token
            draft_probs = None if point_mass else self.q[[last, *draft[:-1]]]
            result = verify(draft, draft_probs, self.p[[last, *draft]], g)
            self.drafted += k
            self.accepted += result.num_accepted
            out += [*draft[: result.num_accepted], result.next_token]
            last = out[-1]
        return out[:length]


WARPS = {"plain": (1.0, 0, 1.0), "warped": (0.8, 5, 0.9)}


@pytest.mark.parametrize(
    "k, point_mass, warp",
    [(2, False, "plain"), (3, False, "warped"), (2, True, "warped"), (3, True, "plain"), (1, False, "warped")],
)
def test_speculative_sampling_reproduces_the_target_distribution(k, point_mass, warp):
    """Every output position (inside the first draft, at the bonus token, and in later steps) and every pair of
    neighbouring positions is distributed as sampling from the target alone."""
    process = BigramProcess(10 + k, *WARPS[warp])
    length, n = k + 2, 12000
    rng, g = np.random.default_rng(k), gen(100 + k)
    samples = np.array([process.generate(length, k, point_mass, rng, g) for _ in range(n)])
    rate = process.accepted / process.drafted
    assert 0.1 < rate < 0.9, rate  # both the accept and the reject paths are exercised
    joint = process.exact_joint(length)
    for i in range(length):
        marginal = joint.sum(axis=tuple(j for j in range(length) if j != i))
        observed = np.bincount(samples[:, i], minlength=VOCAB)
        assert chi_square_pvalue(observed, marginal) > 1e-4, f"position {i}"
    for i in range(length - 1):
        pair = joint.sum(axis=tuple(j for j in range(length) if j not in (i, i + 1)))
        observed = np.bincount(samples[:, i] * VOCAB + samples[:, i + 1], minlength=VOCAB * VOCAB)
        assert chi_square_pvalue(observed, pair) > 1e-4, f"positions {i}, {i + 1}"


def resample_from_target(draft, draft_probs, target_probs, generator):
    """A classic mistake: on rejection, sample from p instead of the residual (p - q)+."""
    uniforms = torch.rand(len(draft), generator=generator, dtype=torch.float64).tolist()
    for i, token in enumerate(draft):
        if uniforms[i] * float(draft_probs[i, token]) < float(target_probs[i, token]):
            continue
        return Verification(i, int(torch.multinomial(target_probs[i], 1, generator=generator)))
    return Verification(len(draft), int(torch.multinomial(target_probs[-1], 1, generator=generator)))


def test_the_statistical_test_detects_a_wrong_verifier():
    """The test above must be able to fail. (Verifying sampled drafts as point masses, by contrast, is exact,
    only less efficient: accepting x with probability p(x), else sampling p without x, yields p for any q.)"""
    process = BigramProcess(10 + 2, *WARPS["plain"])
    n, length = 12000, 4
    rng, g = np.random.default_rng(0), gen(0)
    samples = np.array([process.generate(length, 2, False, rng, g, verify=resample_from_target) for _ in range(n)])
    joint = process.exact_joint(length)
    pvalues = [
        chi_square_pvalue(
            np.bincount(samples[:, i], minlength=VOCAB), joint.sum(axis=tuple(j for j in range(length) if j != i))
        )
        for i in range(length)
    ]
    assert min(pvalues) < 1e-6, pvalues


def test_verifying_sampled_drafts_as_point_masses_is_exact_too():
    process = BigramProcess(10 + 2, *WARPS["plain"])
    n, length = 12000, 4
    rng, g = np.random.default_rng(1), gen(1)

    def as_point_masses(draft, draft_probs, target_probs, generator):
        return verify_sampling(draft, None, target_probs, generator)

    samples = np.array([process.generate(length, 2, False, rng, g, verify=as_point_masses) for _ in range(n)])
    joint = process.exact_joint(length)
    for i in range(length):
        marginal = joint.sum(axis=tuple(j for j in range(length) if j != i))
        assert chi_square_pvalue(np.bincount(samples[:, i], minlength=VOCAB), marginal) > 1e-4


def test_error_to_the_target_shrinks_like_sqrt_n_unlike_the_error_to_other_distributions():
    """vLLM's convergence check: pooled over every emitted token of a step (the target does not depend on the
    context here, as in vLLM's test), the empirical distribution approaches the target as 1/sqrt(N) while its
    distance to random reference distributions stays put."""
    k, vocab = 3, VOCAB
    g = gen(5)
    target = torch.softmax(torch.randn(vocab, generator=g), -1)
    draft = torch.softmax(torch.randn(vocab, generator=g), -1)
    references = torch.softmax(torch.randn(10, vocab, generator=g), -1)
    p, q = target.expand(k + 1, vocab).contiguous(), draft.expand(k, vocab).contiguous()
    counts = np.zeros(vocab)
    sizes, to_target, to_reference = [10, 100, 1000, 10000, 30000], [], []
    draws = 0
    for size in sizes:
        while draws < size:
            tokens = torch.multinomial(q, 1, generator=g)[:, 0].tolist()
            out = verify_sampling(tokens, q, p, g)
            np.add.at(counts, [*tokens[: out.num_accepted], out.next_token], 1)
            draws += 1
        empirical = counts / counts.sum()
        to_target.append(float(np.linalg.norm(empirical - target.numpy())))
        to_reference.append(float(np.mean(np.linalg.norm(empirical - references.numpy(), axis=1))))
    improvement_target = to_target[0] / to_target[-1]
    improvement_reference = to_reference[0] / to_reference[-1]
    assert improvement_target > 20 * improvement_reference, (to_target, to_reference)
    assert to_target[-1] < 0.02
