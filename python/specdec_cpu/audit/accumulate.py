"""Pooling per-position evidence: rank bins, surprisal and point-mass checks.

``AuditAccumulator.add`` takes, for a batch of emitted positions, the target's
final distribution p_t at each and the outcome x_t the sampler produced.  It
keeps only sums, so any number of positions fits in memory:

* per rank bin b: observed count O_b, expected count E_b = Σ_t π_tb where
  π_tb = p_t(ranks in b), and the covariance Σ_t (diag π_t − π_t π_tᵀ) of the
  counts under the target;
* Σ_t (s_t − H_t) and Σ_t Var_t for the surprisal s_t = −log p_t(x_t), whose
  mean under p_t is the entropy H_t and whose variance is
  Var_t = Σ_x p_t(x) (log p_t(x) + H_t)²;
* positions where p_t is a point mass (greedy, top_k = 1, a one-token
  nucleus) carry no information about randomness: they are only checked —
  the outcome must be the one possible token — and counted apart;
* an outcome with p_t(x_t) = 0 elsewhere is impossible under the target and
  recorded as such;
* either kind of outcome outside the support is marked a near tie when the
  caller's ``near_tie`` test says rounding can put it inside (near_ties.py).

:meth:`AuditAccumulator.statistics` turns the sums into the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, SupportsInt

import numpy as np

from .bins import N_FIXED_BINS, RANK_EDGES, TOP_RANKS, bin_label, merge_matrix, merge_plan
from .pvalues import chi2_isf, chi2_sf, normal_two_sided
from .tv import tv_estimate, tv_interval, tv_plugin

__all__ = ["AuditAccumulator", "AuditStatistics", "BinCount", "Mismatch", "MIN_EXPECTED"]

#: Merged rank bins expect at least this many counts (the chi-square and the
#: ellipsoid rest on the counts being close to normal).
MIN_EXPECTED = 20.0


@dataclass(frozen=True)
class Mismatch:
    """An outcome the target cannot produce at its position.

    ``expected`` is the only possible token when the position is a point mass
    (greedy), else None.  ``logit_gap`` (point masses only, when logits were
    given) is how far the outcome's logit is below the argmax's.
    ``near_tie``: rounding of the logits within the audit's tolerance can
    put the outcome inside the support (at a top-p edge, or a near tie with
    the argmax), so it is not evidence of a wrong sampler.  ``source`` says
    where the sequence came from (a file and line, an engine's job).
    """

    sequence: int
    position: int
    token: int
    expected: Optional[int] = None
    logit_gap: Optional[float] = None
    near_tie: bool = False
    source: Optional[str] = None


@dataclass(frozen=True)
class BinCount:
    """One merged rank bin: the ranks it holds, observed and expected counts,
    and the standard deviation of the count under the target."""

    ranks: str
    observed: int
    expected: float
    sd: float


@dataclass
class AuditStatistics:
    """The pooled tests over the informative positions (see the package docstring)."""

    tokens: int
    chi2: float
    chi2_dof: int
    chi2_p: float
    pearson_chi2: float
    pearson_p: float
    z: float
    z_p: float
    mean_surprisal_excess: float
    tv: tuple
    tv_estimate: float
    tv_plugin: float
    level: float
    bins: List[BinCount] = field(default_factory=list)


class AuditAccumulator:
    """Sums of the per-position evidence; feed with :meth:`add`, read with :meth:`statistics`."""

    def __init__(self) -> None:
        self.observed = np.zeros(N_FIXED_BINS)
        self.expected = np.zeros(N_FIXED_BINS)
        self.covariance = np.zeros((N_FIXED_BINS, N_FIXED_BINS))
        self.surprisal_excess = 0.0
        self.surprisal_variance = 0.0
        self.tokens = 0
        self.n_vocab = 0  # the largest row length seen (labels the last bin)
        self.point_mass = 0
        self.mismatches: List[Mismatch] = []
        self.impossible: List[Mismatch] = []

    # -- feeding ---------------------------------------------------------

    def add(self, probs: np.ndarray, outcomes: Sequence[int] | np.ndarray, *, logits: Optional[np.ndarray] = None,
            sequence: int = 0, positions: Sequence[int] | np.ndarray | None = None, source: Optional[str] = None,
            near_tie: Optional[Callable[[int], bool]] = None) -> None:
        """Pool positions: ``probs`` ``(n, V)`` final distributions, ``outcomes`` ``(n,)`` ids.

        ``logits`` ``(n, V)`` (optional) gives the logit gap of greedy
        mismatches; ``sequence``, ``positions`` and ``source`` label what is
        recorded.  ``near_tie(i)`` (optional) says whether row i's outcome,
        outside its support, is within the rounding tolerance of it; it is
        asked for those rows only.
        """
        p = np.asarray(probs, dtype=np.float64)
        if p.ndim == 1:
            p = p[None, :]
        if p.ndim != 2:
            raise ValueError(f"probs must be (n, V), got shape {p.shape}")
        x = np.asarray(outcomes, dtype=np.int64).reshape(-1)
        n, v = p.shape
        self.n_vocab = max(self.n_vocab, v)
        if x.shape[0] != n:
            raise ValueError(f"{x.shape[0]} outcomes for {n} rows of probabilities")
        if n == 0:
            return
        if x.min() < 0 or x.max() >= v:
            bad = int(x.min() if x.min() < 0 else x.max())
            raise ValueError(f"outcome {bad} is outside the vocabulary [0, {v})")
        where = list(range(n)) if positions is None else [int(i) for i in positions]

        px = p[np.arange(n), x]
        point = np.count_nonzero(p > 0, axis=1) == 1

        def tie(i: SupportsInt) -> bool:  # a numpy index
            return near_tie is not None and near_tie(int(i))

        for i in np.flatnonzero(point):
            self.point_mass += 1
            top = int(np.argmax(p[i]))
            if x[i] != top:
                gap = None if logits is None else float(logits[i, top]) - float(logits[i, x[i]])
                self.mismatches.append(Mismatch(sequence, where[i], int(x[i]), top, gap, tie(i), source))
        zero = ~point & (px <= 0)
        for i in np.flatnonzero(zero):
            self.impossible.append(Mismatch(sequence, where[i], int(x[i]), near_tie=tie(i), source=source))
        live = ~point & ~zero
        if not live.any():
            return
        self._pool(p[live], x[live], px[live])

    def _pool(self, p: np.ndarray, x: np.ndarray, px: np.ndarray) -> None:
        n, v = p.shape
        p32 = p.astype(np.float32)
        # Surprisal against entropy.  The logs are taken in float32 (4x faster
        # at vocabulary scale, 6e-8 relative error) and summed in float64;
        # zeros get a finite log (0·log 0 = 0).  Var = Σ p log² p − H² cancels
        # at most ~1e-14 (H² <= log² V), far below any variance that matters.
        logp = np.log(np.maximum(p32, np.float32(1e-45))).astype(np.float64)
        entropy = -np.einsum("ij,ij->i", p, logp)
        variance = np.maximum(np.einsum("ij,ij,ij->i", p, logp, logp) - entropy * entropy, 0.0)
        self.surprisal_excess += float(np.sum(-np.log(px) - entropy))
        self.surprisal_variance += float(np.sum(variance))

        # Rank of the outcome: outcomes strictly more likely, plus equally
        # likely ones with a lower id.
        ids = np.arange(v)
        rank = np.count_nonzero(p > px[:, None], axis=1) + np.count_nonzero(
            (p == px[:, None]) & (ids[None, :] < x[:, None]), axis=1)
        self.observed += np.bincount(np.searchsorted(RANK_EDGES, rank, side="right") - 1,
                                     minlength=N_FIXED_BINS)

        # Bin probabilities from the TOP_RANKS largest values of each row
        # (only they need ordering; the rest is the last bin's mass), ordered
        # in float32: a bin's mass moves by ~1e-7.
        head = min(TOP_RANKS, v)
        top = _top_ascending(p32, head)  # rank r is column head - 1 - r
        bins = np.zeros((n, N_FIXED_BINS))
        for b in range(N_FIXED_BINS - 1):
            lo, hi = min(int(RANK_EDGES[b]), head), min(int(RANK_EDGES[b + 1]), head)
            if hi > lo:
                bins[:, b] = top[:, head - hi:head - lo].sum(axis=1, dtype=np.float64)
        if head < v:
            bins[:, -1] = np.maximum(p.sum(axis=1) - bins.sum(axis=1), 0.0)
        bins /= bins.sum(axis=1, keepdims=True)
        total = bins.sum(axis=0)
        self.expected += total
        self.covariance += np.diag(total) - bins.T @ bins
        self.tokens += n

    # -- reading ---------------------------------------------------------

    def statistics(self, level: float = 0.999, min_expected: float = MIN_EXPECTED) -> Optional[AuditStatistics]:
        """The tests over the informative positions, or None when there are none.

        ``level`` is the confidence level of the TV interval; use 1 − the
        verdict's p-value threshold so that the interval starts at 0 exactly
        when the chi-square passes.
        """
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        n = self.tokens
        if n == 0:
            return None
        groups = merge_plan(self.expected, min_expected)
        m = merge_matrix(groups, N_FIXED_BINS)
        obs, exp = m @ self.observed, m @ self.expected
        cov = m @ self.covariance @ m.T
        d = obs - exp
        bins = [BinCount(bin_label(g[0], g[-1], self.n_vocab), int(round(o)), float(e), math.sqrt(max(float(v), 0.0)))
                for g, o, e, v in zip(groups, obs, exp, np.diag(cov))]

        chi2, dof = _quadratic_form(d, cov)
        chi2_p = chi2_sf(chi2, dof) if dof > 0 else 1.0
        pearson = float(np.sum(d * d / exp)) if len(exp) > 1 else 0.0
        pearson_p = chi2_sf(pearson, len(exp) - 1) if len(exp) > 1 else 1.0
        z = self.surprisal_excess / math.sqrt(self.surprisal_variance) if self.surprisal_variance > 0 else 0.0
        if dof > 0:
            tv = tv_interval(d, cov, n, chi2_isf(1.0 - level, dof))
        else:  # one bin: the rank-bin laws agree trivially, the gap is unknown
            tv = (0.0, 1.0)
        return AuditStatistics(
            tokens=n, chi2=chi2, chi2_dof=dof, chi2_p=chi2_p, pearson_chi2=pearson, pearson_p=pearson_p,
            z=z, z_p=normal_two_sided(z), mean_surprisal_excess=self.surprisal_excess / n,
            tv=tv, tv_estimate=tv_estimate(d, cov, n), tv_plugin=tv_plugin(d, n),
            level=level, bins=bins,
        )


def _top_ascending(p: np.ndarray, head: int) -> np.ndarray:
    """The ``head`` largest values of each row of ``p`` ``(n, V)``, ascending.

    A full partition of a 152k-id row costs more than everything else the
    audit does with it, so each row is first cut to the values at or above a
    threshold read from a strided sample (expected ~2·head of them); a row
    the guess leaves short is partitioned whole.
    """
    n, v = p.shape
    if head >= v:
        return np.sort(p, axis=1)
    stride = max(1, v // (8 * head))
    sample = p[:, ::stride]
    k = min(sample.shape[1], max(1, (2 * head) // stride))  # ~2·head full-row values above it
    guess = np.partition(sample, sample.shape[1] - k, axis=1)[:, sample.shape[1] - k]
    out = np.empty((n, head), dtype=p.dtype)
    for i in range(n):
        cand = p[i][p[i] >= guess[i]]
        if cand.size < head:
            cand = p[i]
        out[i] = np.partition(cand, cand.size - head)[cand.size - head:]
    out.sort(axis=1)
    return out


def _quadratic_form(d: np.ndarray, cov: np.ndarray) -> tuple:
    """dᵀ C⁺ d and the rank of C: the chi-square with the counts' exact covariance.

    Pearson's Σ (O − E)² / E assumes one categorical law for every position;
    pooled over positions with different laws the counts vary less than that
    (Σ π(1 − π) <= E(1 − E/N)), which makes Pearson conservative.  Using the
    covariance itself restores the nominal level and the power.
    """
    if d.size < 2:
        return 0.0, 0
    w, u = np.linalg.eigh(cov)
    keep = w > max(float(w.max()), 0.0) * 1e-10
    proj = u[:, keep].T @ d
    return float(np.sum(proj * proj / w[keep])), int(np.count_nonzero(keep))
