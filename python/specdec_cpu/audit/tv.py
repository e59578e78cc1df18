"""How far the sampler's pooled rank-bin law is from the target's, in total variation.

With O the observed and E the expected counts per rank bin over N audited
tokens, d = O − E estimates N·δ, where δ_b is the average over positions of
P_sampler(rank in b) − P_target(rank in b).  The gap reported is
TV = ½ Σ_b |δ_b|: the total variation between the two pooled rank-bin laws.
It is a lower bound on the mean per-position total variation (binning and
pooling can only hide differences), and it equals it for the common failure
of over-weighting the likely tokens.

The plug-in ½ Σ |d_b| / N is biased upwards: under exact sampling every d_b
is noise and |noise| > 0, so the plug-in never reports 0.  Instead:

* the interval is the range of ½‖δ‖₁ over the chi-square's confidence
  ellipsoid {δ : (d/N − δ)ᵀ (C/N²)⁺ (d/N − δ) ≤ c}, c the chi-square
  quantile at the audit's level, C the covariance of the bin counts under the
  target.  Its lower end is 0 exactly when the chi-square test does not reject
  at that level, and it covers the true gap whenever the ellipsoid holds the
  true δ (probability ≥ the level, to the normal approximation; the covariance
  is the target's, so this assumes a gap small enough not to change it much);
* the point estimate inverts, bin by bin, the mean of a folded normal:
  E|d_b| = g(|N δ_b|) with g(m) = σ √(2/π) e^(−m²/2σ²) + m·erf(m/σ√2), so
  an observed |d_b| below σ√(2/π) (what noise alone gives) counts as 0.
"""

from __future__ import annotations

import itertools
import math
from typing import Tuple

import numpy as np

__all__ = ["tv_interval", "tv_estimate", "tv_plugin"]

_ENUMERATE_MAX_BINS = 16
_ASCENT_STEPS = 400


def tv_plugin(d: np.ndarray, n: int) -> float:
    """½ Σ |d_b| / N: the raw estimate, biased upwards (see the module docstring)."""
    return float(0.5 * np.abs(d).sum() / n) if n else 0.0


def tv_interval(d: np.ndarray, cov: np.ndarray, n: int, c: float) -> Tuple[float, float]:
    """[min, max] of ½‖δ‖₁ over the ellipsoid {δ : (d − Nδ)ᵀ C⁺ (d − Nδ) ≤ c}.

    ``d`` are the count differences O − E per bin, ``cov`` their covariance
    under the target, ``n`` the number of tokens and ``c`` the chi-square
    quantile of the confidence level.  Both ends are clipped to [0, 1].
    """
    if n == 0:
        return 0.0, 1.0
    d = np.asarray(d, dtype=np.float64)
    cov = np.asarray(cov, dtype=np.float64)
    root_c = math.sqrt(c)
    # The ellipsoid's support function: max over δ of sᵀδ is sᵀd + √(c·sᵀCs)
    # (in counts), min is sᵀd − √(c·sᵀCs).  ‖δ‖₁ = max over s in [−1, 1]^B.
    if d.size <= _ENUMERATE_MAX_BINS:
        signs = np.array(list(itertools.product((-1.0, 1.0), repeat=d.size)))
        lin = signs @ d
        quad = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", signs, cov, signs), 0.0))
        # max of a convex function over the box: at a vertex, so exact.
        high = float(np.max(lin + root_c * quad))
        start = signs[int(np.argmax(lin - root_c * quad))]
        low = max(float(np.max(lin - root_c * quad)), _ascend(d, cov, root_c, start))
    else:  # pragma: no cover - the fixed bins number 15
        high = float(np.abs(d).sum() + root_c * math.sqrt(np.abs(cov).sum()))
        low = _ascend(d, cov, root_c, np.sign(d))
    # The dual is <= 0 in exact arithmetic when 0 is inside the ellipsoid;
    # rounding can leave ~1e-16 of the scale: that is 0.
    if low <= 1e-9 * (np.abs(d).sum() + root_c * math.sqrt(max(float(np.trace(cov)), 0.0))):
        low = 0.0
    return min(max(0.5 * low / n, 0.0), 1.0), min(max(0.5 * high / n, 0.0), 1.0)


def _ascend(d: np.ndarray, cov: np.ndarray, root_c: float, start: np.ndarray) -> float:
    """A lower bound on min ‖δ‖₁ over the ellipsoid, by projected supergradient
    ascent of the concave dual f(s) = sᵀd − √c·√(sᵀCs) over the box.

    Every s in the box gives a valid bound (weak duality), so stopping early
    only makes the interval's lower end more conservative.
    """
    def f(s: np.ndarray) -> float:
        return float(s @ d - root_c * math.sqrt(max(float(s @ cov @ s), 0.0)))

    s = start.astype(np.float64).copy()
    best = f(s)
    scale = float(np.abs(d).max()) or 1.0
    for k in range(1, _ASCENT_STEPS + 1):
        cs = cov @ s
        norm = math.sqrt(max(float(s @ cs), 0.0))
        grad = d - (root_c * cs / norm if norm > 0 else 0.0)
        step = 1.0 / (scale * math.sqrt(k))
        s = np.clip(s + step * grad, -1.0, 1.0)
        best = max(best, f(s))
    return best


def tv_estimate(d: np.ndarray, cov: np.ndarray, n: int) -> float:
    """The moment-corrected gap: ½ Σ_b m_b / N with E|d_b| = g(m_b) solved per bin."""
    if n == 0:
        return 0.0
    total = 0.0
    for db, var in zip(np.abs(np.asarray(d, dtype=np.float64)), np.diag(cov)):
        total += _folded_mean_inverse(float(db), math.sqrt(max(float(var), 0.0)))
    return min(0.5 * total / n, 1.0)


def _folded_mean_inverse(observed: float, sigma: float) -> float:
    """The m >= 0 with E|N(m, σ²)| = observed (0 when noise alone explains it)."""
    if sigma == 0.0:
        return observed
    floor = sigma * math.sqrt(2.0 / math.pi)
    if observed <= floor:
        return 0.0

    def g(m: float) -> float:
        return sigma * math.sqrt(2.0 / math.pi) * math.exp(-0.5 * (m / sigma) ** 2) + m * math.erf(
            m / (sigma * math.sqrt(2.0)))

    lo, hi = 0.0, observed  # g(m) >= m, so the root is at most `observed`
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if g(mid) < observed:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
