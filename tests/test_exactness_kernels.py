"""Exactness of the sampling kernels, by chi-square over many draws.

Speculative sampling is only worth having if the emitted tokens follow the
target's distribution p *exactly*, whatever the draft does.  Each test here
draws tens of thousands of tokens through ``sample`` / ``verify`` with fixed
seeds and checks them against p computed independently in float64
(``stats_helpers.expected_distribution``).  The threshold (p-value < 1e-6)
is one a correct implementation crosses less than once in a million runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from stats_helpers import assert_binomial, assert_matches_distribution, expected_distribution

from specdec_cpu import SamplingParams, sampling
from specdec_cpu.sampling import DRAFT_STREAM, VERIFY_STREAM, Rng

N = 40_000  # draws per check: ~0.3 s of verify calls at these vocabulary sizes


def logits_row(v: int, seed: int, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=v) * scale).astype(np.float32)


def draw_from(q: np.ndarray, n: int, seed: int) -> np.ndarray:
    """n independent draft tokens from q, with numpy's generator (not the kernel's)."""
    q64 = q.astype(np.float64)
    q64 /= q64.sum()
    return np.random.default_rng(seed).choice(q64.size, size=(n, 1), p=q64).astype(np.int32)


def run_one_row(target: np.ndarray, q: np.ndarray | None, tokens: np.ndarray, params, seed: int):
    """γ = 1 verify over pre-drawn draft tokens.

    ``target`` is ``(2, V)``: row 0 checks the draft token, row 1 gives the
    bonus.  Returns (counts of the first emitted token, counts of the bonus
    token over the accepted calls, number of accepted calls, first alphas).
    """
    v = target.shape[1]
    first = np.zeros(v, dtype=np.int64)
    bonus = np.zeros(v, dtype=np.int64)
    rng = Rng(seed, VERIFY_STREAM)
    q_rows = None if q is None else np.ascontiguousarray(q.reshape(1, v), dtype=np.float32)
    accepted = 0
    alpha0 = None
    for i in range(tokens.shape[0]):
        res = sampling.verify(target, tokens[i], q_rows, params, rng)
        if res.n_accepted == 1:
            accepted += 1
            first[tokens[i, 0]] += 1
            bonus[res.token] += 1
        else:
            assert res.n_accepted == 0, res
            first[res.token] += 1
        if alpha0 is None:
            alpha0 = float(res.alphas[0])
    return first, bonus, accepted, alpha0


def check_one_row(target_logits, draft_logits, params, seed, n=N, bonus_logits=None):
    """The emitted token follows p, the bonus follows its row, acceptance is Σ min(p, q)."""
    v = target_logits.size
    bonus_logits = logits_row(v, seed + 7) if bonus_logits is None else bonus_logits
    target = np.ascontiguousarray(np.stack([target_logits, bonus_logits]), dtype=np.float32)
    q = sampling.distribution(draft_logits, params)
    tokens = draw_from(q, n, seed)
    first, bonus, accepted, alpha0 = run_one_row(target, q, tokens, params, seed)

    p = expected_distribution(target_logits, params=params)
    p_bonus = expected_distribution(bonus_logits, params=params)
    alpha = float(np.minimum(p, q.astype(np.float64)).sum())
    assert_matches_distribution(first, p, what="emitted token")
    if accepted:
        assert_matches_distribution(bonus, p_bonus, what="bonus token")
    assert_binomial(accepted, n, alpha, what="acceptance rate")
    assert alpha0 == pytest.approx(alpha, abs=2e-5)
    return accepted


# --------------------------------------------------------------------------
# sample() alone
# --------------------------------------------------------------------------

SAMPLE_CASES = [
    SamplingParams(),
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=2.0, top_k=7),
    SamplingParams(temperature=1.0, top_p=0.6),
    SamplingParams(temperature=0.8, min_p=0.1),
    SamplingParams(temperature=1.3, top_k=20, top_p=0.9, min_p=0.02),
]


@pytest.mark.parametrize("params", SAMPLE_CASES, ids=repr)
def test_sample_follows_distribution(isa, params):
    v = 40
    logits = logits_row(v, 11)
    logits[[3, 17]] = -np.inf  # impossible tokens must never come out
    rng = Rng(1234, DRAFT_STREAM)
    counts = np.bincount([sampling.sample(logits, params, rng) for _ in range(N)], minlength=v)
    p = expected_distribution(logits, params=params)
    assert_matches_distribution(counts, p, what=f"sample() [{isa}]")
    # distribution() is what sample() draws from
    np.testing.assert_allclose(sampling.distribution(logits, params), p, atol=2e-6)


def test_sample_into_draws_from_the_row_it_writes(isa):
    v = 30
    logits = logits_row(v, 5)
    params = SamplingParams(temperature=0.9, top_p=0.8)
    out = np.full(v + 3, -1.0, dtype=np.float32)
    rng = Rng(99, DRAFT_STREAM)
    counts = np.zeros(v, dtype=np.int64)
    for _ in range(N):
        counts[sampling.sample_into(logits, params, rng, out)] += 1
    p = expected_distribution(logits, params=params)
    assert_matches_distribution(counts, p, what=f"sample_into() [{isa}]")
    np.testing.assert_allclose(out[:v], p, atol=2e-6)
    assert np.all(out[v:] == 0.0), "sample_into must zero-pad past len(logits)"


# --------------------------------------------------------------------------
# One-row verify: emitted token ~ p, bonus ~ row γ, acceptance = Σ min(p, q)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("v,seed", [(8, 1), (23, 2), (50, 3)])
def test_verify_random_p_q(isa, v, seed):
    target = logits_row(v, seed)
    draft = target + logits_row(v, seed + 100, scale=1.5)
    accepted = check_one_row(target, draft, SamplingParams(), seed)
    assert 0.05 * N < accepted < 0.95 * N  # both branches were exercised


def test_verify_random_p_q_with_temperature():
    v = 30
    target = logits_row(v, 21)
    draft = logits_row(v, 22)
    check_one_row(target, draft, SamplingParams(temperature=0.6), 21)
    check_one_row(target, draft, SamplingParams(temperature=2.5), 22)


def test_verify_p_equals_q_always_accepts_and_bonus_follows_row_gamma(isa):
    v = 25
    target = logits_row(v, 31)
    params = SamplingParams(temperature=0.9)
    accepted = check_one_row(target, target.copy(), params, 31)
    assert accepted == N, f"p == q must always accept, accepted {accepted}/{N}"


def test_verify_disjoint_supports_always_rejects(isa):
    v = 20
    target = logits_row(v, 41)
    draft = logits_row(v, 42)
    target[10:] = -np.inf
    draft[:10] = -np.inf
    accepted = check_one_row(target, draft, SamplingParams(), 41)
    assert accepted == 0


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=5),
        SamplingParams(top_p=0.6),
        SamplingParams(temperature=0.7, min_p=0.15),
        SamplingParams(temperature=1.2, top_k=10, top_p=0.8, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=3, top_p=0.9),
    ],
    ids=repr,
)
def test_verify_mismatched_truncated_supports(isa, params):
    """Same params on both sides, different logits: the kept supports differ."""
    v = 40
    target = logits_row(v, 51)
    draft = 0.5 * target + logits_row(v, 52, scale=1.5)
    p_support = expected_distribution(target, params=params) > 0
    q_support = sampling.distribution(draft, params) > 0
    assert (p_support != q_support).any(), "test setup: supports should differ"
    check_one_row(target, draft, params, 51)


def test_verify_residual_underflow_when_p_is_almost_q(isa):
    """q differs from p by float noise: the residual mass is ~0, yet output ~ p."""
    v = 16
    target = logits_row(v, 61)
    draft = target + np.float32(1e-6) * logits_row(v, 62, scale=1.0)
    check_one_row(target, draft, SamplingParams(), 61)


def test_verify_pointer_path_is_exact():
    """verify_pointer (llama.cpp's buffer, no copy) behaves like verify."""
    v = 24
    params = SamplingParams(temperature=0.8, top_k=12)
    target_logits = logits_row(v, 71)
    draft = logits_row(v, 72)
    target = np.ascontiguousarray(np.stack([target_logits, logits_row(v, 73)]))
    q = sampling.distribution(draft, params)
    q_rows = q.reshape(1, v).copy()
    tokens = draw_from(q, N, 71)
    rng = Rng(71, VERIFY_STREAM)
    rng_same = Rng(71, VERIFY_STREAM)
    first = np.zeros(v, dtype=np.int64)
    for i in range(N):
        res = sampling.verify_pointer(target.ctypes.data, 2, v, tokens[i], q_rows, params, rng)
        if i < 200:  # same stream, same inputs -> same result as verify()
            ref = sampling.verify(target, tokens[i], q_rows, params, rng_same)
            assert (res.n_accepted, res.token) == (ref.n_accepted, ref.token)
            np.testing.assert_array_equal(res.alphas, ref.alphas)
        first[tokens[i, 0] if res.n_accepted else res.token] += 1
    assert_matches_distribution(first, expected_distribution(target_logits, params=params), what="verify_pointer")


# --------------------------------------------------------------------------
# Greedy and deterministic (one-hot) drafts
# --------------------------------------------------------------------------


def test_verify_greedy_is_argmax_with_lowest_id_ties(isa):
    v = 12
    params = SamplingParams(temperature=0.0)
    row0 = np.zeros(v, dtype=np.float32)
    row0[[4, 9]] = 3.0  # tie: the argmax is 4
    row1 = logits_row(v, 81)
    target = np.ascontiguousarray(np.stack([row0, row1]))
    bonus = int(np.argmax(row1))
    rng = Rng(5, VERIFY_STREAM)
    for _ in range(200):
        # draft agrees -> accepted, bonus is row 1's argmax
        q = np.zeros((1, v), dtype=np.float32)
        q[0, 4] = 1.0
        res = sampling.verify(target, np.array([4]), q, params, rng)
        assert (res.n_accepted, res.token) == (1, bonus)
        assert res.alphas[0] == pytest.approx(1.0)
        # draft picks the other tied token -> rejected, the target's argmax (4) is emitted
        q = np.zeros((1, v), dtype=np.float32)
        q[0, 9] = 1.0
        res = sampling.verify(target, np.array([9]), q, params, rng)
        assert (res.n_accepted, res.token) == (0, 4)
        assert res.alphas[0] == pytest.approx(0.0)
        # deterministic drafter, same answers
        assert sampling.verify(target, np.array([4]), None, params, rng).n_accepted == 1
        res = sampling.verify(target, np.array([0]), None, params, rng)
        assert (res.n_accepted, res.token) == (0, 4)
    # greedy sampling and distribution agree
    assert sampling.sample(row0, params, rng) == 4
    np.testing.assert_array_equal(sampling.distribution(row0, params), np.eye(v, dtype=np.float32)[4])


def test_verify_greedy_with_draft_distribution_from_kernel(isa):
    """T = 0 on both sides with q from distribution(): accept iff the argmaxes agree."""
    v = 30
    params = SamplingParams(temperature=0.0)
    rng = Rng(3, VERIFY_STREAM)
    for seed in range(50):
        t0, t1, d = logits_row(v, 1000 + seed), logits_row(v, 2000 + seed), logits_row(v, 3000 + seed)
        if seed % 3 == 0:
            d = t0.copy()
        q = sampling.distribution(d, params).reshape(1, v)
        x = int(np.argmax(q))
        res = sampling.verify(np.stack([t0, t1]), np.array([x]), q, params, rng)
        if x == int(np.argmax(t0)):
            assert (res.n_accepted, res.token) == (1, int(np.argmax(t1)))
        else:
            assert (res.n_accepted, res.token) == (0, int(np.argmax(t0)))


@pytest.mark.parametrize("which", ["argmax", "unlikely", "outside_support"])
def test_verify_one_hot_draft_fixed_token(isa, which):
    """draft_probs=None: accept with probability p(x), else the residual p without x."""
    v = 30
    params = SamplingParams(temperature=1.0, top_k=12)
    target_logits = logits_row(v, 91)
    p = expected_distribution(target_logits, params=params)
    order = np.argsort(-p, kind="stable")
    x = {"argmax": order[0], "unlikely": order[11], "outside_support": order[20]}[which]
    assert (p[x] > 0) == (which != "outside_support")
    target = np.ascontiguousarray(np.stack([target_logits, logits_row(v, 92)]))
    tokens = np.full((N, 1), x, dtype=np.int32)
    first, bonus, accepted, alpha0 = run_one_row(target, None, tokens, params, 91)
    assert_matches_distribution(first, p, what=f"one-hot draft of a {which} token")
    assert_binomial(accepted, N, float(p[x]), what="one-hot acceptance")
    assert alpha0 == pytest.approx(p[x], abs=2e-5)
    if accepted:
        assert_matches_distribution(bonus, expected_distribution(target[1], params=params), what="bonus")


def test_verify_one_hot_draft_varying_token(isa):
    """A deterministic drafter whose guess changes call to call (any rule) stays exact."""
    v = 20
    params = SamplingParams(temperature=0.7, top_p=0.9)
    target_logits = logits_row(v, 95)
    target = np.ascontiguousarray(np.stack([target_logits, logits_row(v, 96)]))
    tokens = (np.arange(N, dtype=np.int32) * 7 % v).reshape(N, 1)
    first, _, _, _ = run_one_row(target, None, tokens, params, 95)
    assert_matches_distribution(first, expected_distribution(target_logits, params=params), what="one-hot drafts")


# --------------------------------------------------------------------------
# Multi-row verify: the joint law of the first emitted tokens
# --------------------------------------------------------------------------


class MarkovPair:
    """A target and a draft that are both first-order Markov chains over V ids.

    The first token comes from ``start`` logits, every next token from
    ``table[prev]``.  Speculative decoding of the target with the draft must
    produce the target chain's joint law.
    """

    def __init__(self, v: int, seed: int, draft_noise: float):
        g = np.random.default_rng(seed)
        self.v = v
        # row v of each table is the start row, so a context (None -> v) indexes it
        self.target = (g.normal(size=(v + 1, v)) * 1.5).astype(np.float32)
        self.draft = (self.target + g.normal(size=(v + 1, v)) * draft_noise).astype(np.float32)

    def joint(self, params, m: int) -> np.ndarray:
        """P(first m tokens) of the target chain, shape (V,)*m."""
        rows = np.array([expected_distribution(r, params=params) for r in self.target])
        out = rows[self.v]
        for _ in range(m - 1):
            out = out[..., None] * rows[: self.v].reshape((1,) * (out.ndim - 1) + (self.v, self.v))
        return out

    def run(self, params, gamma: int, m: int, n: int, seed: int, one_hot: bool = False):
        """Speculatively decode the first m tokens n times; count them and the n_accepted."""
        v = self.v
        counts = np.zeros((v,) * m, dtype=np.int64)
        accepted_hist = np.zeros(gamma + 1, dtype=np.int64)
        rng_d, rng_v = Rng(seed, DRAFT_STREAM), Rng(seed, VERIFY_STREAM)
        q = np.empty((gamma, v), dtype=np.float32)
        toks = np.empty(gamma, dtype=np.int32)
        ctx = np.empty(gamma + 1, dtype=np.intp)
        for _ in range(n):
            out: list[int] = []
            while len(out) < m:
                prev = out[-1] if out else v
                ctx[0] = prev
                s = prev
                for j in range(gamma):
                    s = sampling.sample_into(self.draft[s], params, rng_d, q[j])
                    toks[j] = s
                    ctx[j + 1] = s
                res = sampling.verify(self.target[ctx], toks, None if one_hot else q, params, rng_v)
                accepted_hist[res.n_accepted] += 1
                assert len(res.alphas) == (gamma if res.n_accepted == gamma else res.n_accepted + 1)
                out.extend(toks[: res.n_accepted].tolist())
                out.append(res.token)
            counts[tuple(out[:m])] += 1
        return counts, accepted_hist


@pytest.mark.parametrize(
    "gamma,v,m,params",
    [
        (2, 6, 2, SamplingParams()),
        (2, 8, 2, SamplingParams(temperature=0.8, top_k=5)),
        (3, 5, 2, SamplingParams(temperature=1.2, top_p=0.85)),
        (3, 4, 3, SamplingParams()),
    ],
    ids=["g2-plain", "g2-topk", "g3-topp", "g3-three-tokens"],
)
def test_multi_row_verify_keeps_the_joint_distribution(isa, gamma, v, m, params):
    pair = MarkovPair(v, seed=100 + gamma * 10 + v, draft_noise=1.0)
    n = 25_000
    counts, hist = pair.run(params, gamma, m, n, seed=7)
    assert_matches_distribution(counts, pair.joint(params, m), what=f"first {m} tokens (γ={gamma}, {isa})")
    # every path (rejection at each row, all accepted + bonus) was taken
    assert np.all(hist > 0.01 * hist.sum()), f"n_accepted histogram {hist.tolist()}"


def test_multi_row_verify_one_hot_drafts_keep_the_joint_distribution():
    """γ = 2 with draft_probs=None: tokens sampled by the draft but verified as one-hot."""
    pair = MarkovPair(6, seed=333, draft_noise=0.7)
    params = SamplingParams(temperature=0.9)
    counts, hist = pair.run(params, 2, 2, 25_000, seed=8, one_hot=True)
    assert_matches_distribution(counts, pair.joint(params, 2), what="first 2 tokens, one-hot drafts")
    assert np.all(hist > 0)


def test_multi_row_stops_at_first_rejection():
    """A certain rejection at row 0 ends the step: one alpha, never the rejected token."""
    v = 10
    params = SamplingParams()
    target = np.stack([logits_row(v, 1), logits_row(v, 2), logits_row(v, 3), logits_row(v, 4)])
    target[0, 5] = -np.inf  # token 5 is impossible in row 0 -> certain rejection there
    q = np.full((3, v), 1.0 / v, dtype=np.float32)
    rng = Rng(0, VERIFY_STREAM)
    for _ in range(500):
        res = sampling.verify(target, np.array([5, 1, 2]), q, params, rng)
        assert res.n_accepted == 0
        assert res.token != 5
        assert res.alphas.shape == (1,)
