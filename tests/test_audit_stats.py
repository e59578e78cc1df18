"""The audit's statistics on synthetic distributions: calibration and power.

Everything here feeds ``AuditAccumulator`` with rows p_t built in numpy
(Zipf-like logits over a few thousand ids at a temperature that varies from
position to position, like a language model's) and outcomes drawn either
exactly from p_t or from a deliberately biased sampler.  The audit must pass
the first (at the project's 1e-6 threshold) and flag the second at its own
verdict threshold (1e-3).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from specdec_cpu.audit import AuditAccumulator
from specdec_cpu.audit.bins import RANK_EDGES, bin_label, merge_plan
from specdec_cpu.audit.pvalues import chi2_isf, chi2_sf, normal_two_sided

VERDICT = 1e-3  # the CLI's default threshold
ROBUST = 1e-6   # what a correct sampler may fail at most this often


def zipf_rows(rng: np.random.Generator, n: int, v: int, t_range=(0.6, 1.5)) -> np.ndarray:
    """n distributions over v ids: logits −log(rank) + noise, at a random temperature per row."""
    logits = -np.log(np.arange(1, v + 1))[None, :] + rng.normal(0.0, 0.5, (n, v))
    temps = rng.uniform(*t_range, (n, 1))
    z = logits / temps
    z -= z.max(axis=1, keepdims=True)
    w = np.exp(z)
    return w / w.sum(axis=1, keepdims=True)


def draw(rng: np.random.Generator, p: np.ndarray) -> np.ndarray:
    """One outcome per row of p (inverse CDF)."""
    c = np.cumsum(p, axis=1)
    u = rng.random((p.shape[0], 1)) * c[:, -1:]
    return np.minimum(np.count_nonzero(c < u, axis=1), p.shape[1] - 1)


def mixed_with_argmax(p: np.ndarray, eps: float) -> np.ndarray:
    """The biased sampler's law: (1 − eps)·p + eps·onehot(argmax p)."""
    q = (1.0 - eps) * p
    q[np.arange(p.shape[0]), p.argmax(axis=1)] += eps
    return q


# --------------------------------------------------------------------------
# p-values without scipy
# --------------------------------------------------------------------------


def test_pvalues_match_scipy():
    for dof in (1, 2, 3, 7, 14, 40, 300):
        for x in (1e-4, 0.3, 1.0, 4.0, 12.0, 33.0, 80.0, 400.0, 2000.0):
            want = stats.chi2.sf(x, dof)
            assert chi2_sf(x, dof) == pytest.approx(want, rel=1e-9, abs=1e-300), (x, dof)
        for p in (0.5, 1e-3, 1e-9):
            assert chi2_isf(p, dof) == pytest.approx(stats.chi2.isf(p, dof), rel=1e-9)
    for z in (0.0, 0.5, -2.0, 3.3, -8.0, 30.0):
        assert normal_two_sided(z) == pytest.approx(2 * stats.norm.sf(abs(z)), rel=1e-12, abs=1e-300)
    assert chi2_sf(0.0, 3) == 1.0 and chi2_sf(math.inf, 3) == 0.0
    with pytest.raises(ValueError, match="dof"):
        chi2_sf(1.0, 0)


# --------------------------------------------------------------------------
# bins, ranks, point masses
# --------------------------------------------------------------------------


def test_rank_bins_and_labels():
    assert list(RANK_EDGES[:8]) == [0, 1, 2, 3, 5, 8, 16, 32]
    assert [bin_label(i, i) for i in range(6)] == ["0", "1", "2", "3-4", "5-7", "8-15"]
    assert bin_label(6, 9, n_vocab=200) == "16-199"
    assert bin_label(14, 14) == "4096+"
    # groups close once they expect enough; a short tail joins the last group
    assert merge_plan([50, 30, 10, 10, 4, 1, 0, 0], 20) == [[0], [1], [2, 3, 4, 5]]
    assert merge_plan([50, 30, 10, 10, 25, 1, 0, 0], 20) == [[0], [1], [2, 3], [4, 5]]
    assert merge_plan([5, 5, 5], 20) == [[0, 1, 2]]


def test_expected_counts_covariance_ranks_and_surprisal():
    # Ranks by probability, ties to the lower id: 4, 1, 3, 5 (3 and 5 tie: 3 first), 0, 2.
    p = np.array([0.05, 0.3, 0.02, 0.1, 0.43, 0.1])
    other = np.array([0.9, 0.02, 0.02, 0.02, 0.02, 0.02])
    acc = AuditAccumulator()
    acc.add(np.stack([p, p, p, other]), [4, 5, 5, 0])
    pi = np.array([p[4], p[1], p[3], p[5] + p[0], p[2]])  # ranks 0, 1, 2, 3-4, 5-7
    pi2 = np.array([0.9, 0.02, 0.02, 0.04, 0.02])
    np.testing.assert_allclose(acc.expected[:5], 3 * pi + pi2, rtol=1e-6)
    assert acc.expected[5:].sum() == 0
    np.testing.assert_array_equal(acc.observed[:5], [2, 0, 0, 2, 0])  # 4 and 0: rank 0; 5: rank 3
    # Positions with different laws: the covariance sums theirs (which is less
    # than one common law with the pooled expectation would give).
    want = 3 * (np.diag(pi) - np.outer(pi, pi)) + np.diag(pi2) - np.outer(pi2, pi2)
    np.testing.assert_allclose(acc.covariance[:5, :5], want, rtol=1e-6, atol=1e-12)
    # surprisal against entropy, summed
    h, h2 = -np.sum(p * np.log(p)), -np.sum(other * np.log(other))
    var = np.sum(p * np.log(p) ** 2) - h * h
    var2 = np.sum(other * np.log(other) ** 2) - h2 * h2
    want_excess = -np.log(p[[4, 5, 5]]).sum() - 3 * h - np.log(0.9) - h2
    # (the accumulator takes the logs in float32: ~1e-7 relative)
    assert acc.surprisal_excess == pytest.approx(want_excess, rel=1e-6)
    assert acc.surprisal_variance == pytest.approx(3 * var + var2, rel=1e-6)


def test_bin_masses_at_vocabulary_scale():
    """Beyond 4,096 ids only the head of each row is ordered (after a
    threshold guessed from a sample): it must be exactly the head a full sort
    gives, for flat, peaked and tied rows, and the expected counts must match."""
    from specdec_cpu.audit.accumulate import _top_ascending

    rng = np.random.default_rng(3)
    v = 40_000
    rows = np.concatenate([rng.dirichlet(np.full(v, c), size=2) for c in (0.01, 0.3, 5.0)])
    rows[0] = 1.0 / v  # one big tie
    rows[1, :5] = 0.2
    rows[1, 5:] = 0.0  # five ids: the guess leaves the row short, the full partition runs
    top = _top_ascending(rows.astype(np.float32), 4096)
    np.testing.assert_array_equal(top, np.sort(rows.astype(np.float32), axis=1)[:, -4096:])
    acc = AuditAccumulator()
    acc.add(rows[2:], rng.integers(0, v, 4))
    ordered = -np.sort(-rows[2:], axis=1)
    want = [ordered[:, lo:hi].sum() for lo, hi in zip(RANK_EDGES[:-1], RANK_EDGES[1:])] + [ordered[:, 4096:].sum()]
    np.testing.assert_allclose(acc.expected, want, rtol=1e-5, atol=1e-7)


def test_point_masses_are_checked_not_tested():
    acc = AuditAccumulator()
    onehot = np.zeros((3, 5))
    onehot[:, 2] = 1.0
    logits = np.array([[0.0, 0.0, 1.0, 0.99, 0.0]] * 3)
    acc.add(onehot, [2, 3, 2], logits=logits, sequence=7, positions=[10, 11, 12])
    assert acc.point_mass == 3 and acc.tokens == 0 and acc.statistics() is None
    (m,) = acc.mismatches
    assert (m.sequence, m.position, m.token, m.expected) == (7, 11, 3, 2)
    assert m.logit_gap == pytest.approx(0.01)
    # an outcome outside the support of a non-point-mass row is impossible
    acc.add(np.array([[0.5, 0.5, 0.0, 0.0, 0.0]]), [4], sequence=1, positions=[0])
    assert [(i.sequence, i.token) for i in acc.impossible] == [(1, 4)] and acc.tokens == 0
    with pytest.raises(ValueError, match="outside the vocabulary"):
        acc.add(np.array([[0.5, 0.5]]), [2])
    with pytest.raises(ValueError, match="2 outcomes for 1 rows"):
        acc.add(np.array([[0.5, 0.5]]), [0, 1])


# --------------------------------------------------------------------------
# calibration under exact sampling, power against a biased sampler
# --------------------------------------------------------------------------


def test_tests_hold_their_level_under_exact_sampling():
    """Many small exact audits: the share of p-values below 0.05 must be ~5%
    (the chi-square with the counts' exact covariance is not conservative,
    Pearson's form is), and the TV interval starts at 0 as often as the
    chi-square passes at the interval's level."""
    rng = np.random.default_rng(2024)
    runs, n, v = 600, 200, 64
    chi, zed, pearson, starts_at_zero, passes = [], [], [], 0, 0
    for _ in range(runs):
        p = zipf_rows(rng, n, v, (0.4, 1.5))
        acc = AuditAccumulator()
        acc.add(p, draw(rng, p))
        st = acc.statistics(level=0.95)
        chi.append(st.chi2_p)
        zed.append(st.z_p)
        pearson.append(st.pearson_p)
        starts_at_zero += st.tv[0] == 0.0
        passes += st.chi2_p >= 0.05
    for name, pv in (("chi-square", chi), ("surprisal z", zed)):
        below = int(np.sum(np.asarray(pv) < 0.05))
        assert stats.binomtest(below, runs, 0.05).pvalue > ROBUST, f"{name}: {below}/{runs} below 0.05"
    assert np.mean(np.asarray(pearson) < 0.05) <= np.mean(np.asarray(chi) < 0.05) + 0.01
    assert starts_at_zero == passes


@pytest.fixture(scope="module")
def power_run():
    """20,000 positions of realistic shape; the same p_t rows audited twice:
    with exact draws, and with draws from 0.98·p_t + 0.02·onehot(argmax p_t)."""
    rng = np.random.default_rng(15)
    exact, biased = AuditAccumulator(), AuditAccumulator()
    eps, gap, n = 0.02, 0.0, 20_000
    for _ in range(n // 1000):
        p = zipf_rows(rng, 1000, 3000)
        exact.add(p, draw(rng, p))
        biased.add(p, draw(rng, mixed_with_argmax(p, eps)))
        gap += eps * float(np.sum(1.0 - p.max(axis=1)))  # TV(q_t, p_t) summed
    return exact, biased, gap / n


def test_exact_samples_pass(power_run):
    exact, _, _ = power_run
    st = exact.statistics(level=1 - ROBUST)
    print(f"exact: chi2 p = {st.chi2_p:.3g}, z = {st.z:+.2f} (p = {st.z_p:.3g}), tv {st.tv}")
    assert st.tokens == 20_000
    assert st.chi2_p > ROBUST and st.z_p > ROBUST
    assert st.tv[0] == 0.0 and st.tv[1] < 0.05
    assert exact.statistics(level=1 - VERDICT).tv[0] == 0.0


def test_two_percent_argmax_bias_is_flagged_and_sized(power_run):
    _, biased, gap = power_run
    st = biased.statistics(level=1 - VERDICT)
    print(f"biased (true gap {gap:.4f}): chi2 p = {st.chi2_p:.3g}, z = {st.z:+.2f} (p = {st.z_p:.3g}), "
          f"tv {st.tv}, estimate {st.tv_estimate:.4f}")
    assert min(st.chi2_p, st.z_p) < VERDICT  # the verdict fails
    assert st.z < 0  # toward likely tokens
    assert st.bins[0].ranks == "0" and st.bins[0].observed > st.bins[0].expected
    # For this sampler the pooled rank-bin gap equals the mean per-position TV.
    assert st.tv[0] > 0.0 and st.tv[0] <= gap <= st.tv[1]
    assert st.tv_estimate == pytest.approx(gap, abs=0.006)
    assert st.tv_plugin > st.tv_estimate  # the raw estimate's upward bias


def test_verdict_fails_on_either_test_and_on_impossible_tokens():
    from specdec_cpu import SamplingParams
    from specdec_cpu.audit import AuditReport, AuditStatistics, Mismatch

    def report(chi2_p=0.5, z=0.3, z_p=0.7, impossible=(), mismatches=()):
        st = AuditStatistics(tokens=500, chi2=1.0, chi2_dof=5, chi2_p=chi2_p, pearson_chi2=1.0, pearson_p=0.5,
                             z=z, z_p=z_p, mean_surprisal_excess=0.0, tv=(0.0, 0.1), tv_estimate=0.0,
                             tv_plugin=0.01, level=0.999)
        return AuditReport(target="t.gguf", params=SamplingParams(), chain="temperature-first", sequences=1,
                           stopped=0, positions=500, point_mass=len(mismatches), statistics=st,
                           mismatches=list(mismatches), impossible=list(impossible))

    assert report().verdict == "pass" and report().reasons == []
    assert "chi-square" in report(chi2_p=5e-4).reasons[0]
    (reason,) = report(z=-4.0, z_p=6e-5).reasons
    assert "surprisal z = -4.00" in reason and "more likely tokens" in reason
    assert "less likely tokens" in report(z=4.0, z_p=6e-5).reasons[0]
    assert report(impossible=[Mismatch(0, 3, 17)]).verdict == "fail"
    near, far = Mismatch(0, 1, 5, 4, 0.01, near_tie=True), Mismatch(0, 2, 5, 4, 0.7)
    assert report(mismatches=[near]).verdict == "pass"  # a near tie: batch noise can flip it
    assert report(mismatches=[near, far]).verdict == "fail"
    edge = Mismatch(0, 4, 9, near_tie=True)  # just outside the nucleus
    assert report(impossible=[edge]).verdict == "pass"
    assert report(impossible=[edge, Mismatch(0, 3, 17)]).reasons == [
        "1 tokens with probability 0 under the target's distribution (beyond the tie tolerance 0.05)"]
    data = report(chi2_p=5e-4).to_dict()
    assert data["verdict"] == "fail" and data["chi2_p"] == 5e-4 and data["tv"] == [0.0, 0.1]
