"""Tail probabilities of the chi-square and normal laws, without scipy.

The audit runs in a base install (numpy and llama-cpp-python only), so the
two p-values it needs are computed here: the chi-square survival function
through the regularised upper incomplete gamma function, and the normal
two-sided tail through ``math.erfc``.  Both keep their relative accuracy far
into the tail (p-values of 1e-300 are still meaningful to compare), which a
``1 - cdf`` formulation would not.
"""

from __future__ import annotations

import math

__all__ = ["chi2_sf", "chi2_isf", "normal_two_sided"]

_EPS = 1e-15
_TINY = 1e-300
_MAX_ITER = 10_000


def chi2_sf(x: float, dof: float) -> float:
    """P(X >= x) for X chi-square with ``dof`` degrees of freedom (> 0)."""
    if not dof > 0:
        raise ValueError(f"dof must be > 0, got {dof}")
    if math.isnan(x):
        raise ValueError("x is NaN")
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    return _gamma_q(0.5 * dof, 0.5 * x)


def chi2_isf(p: float, dof: float) -> float:
    """The x with ``chi2_sf(x, dof) = p``, for p in (0, 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = 0.0, max(1.0, 2.0 * dof)
    while chi2_sf(hi, dof) > p:
        lo, hi = hi, 2.0 * hi
    # sf is strictly decreasing: bisect to a relative width of ~1e-12.
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if chi2_sf(mid, dof) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def normal_two_sided(z: float) -> float:
    """P(|Z| >= |z|) for a standard normal Z."""
    if math.isnan(z):
        raise ValueError("z is NaN")
    return math.erfc(abs(z) / math.sqrt(2.0))


def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) = Γ(a, x) / Γ(a)."""
    # log of x^a e^-x / Γ(a): the common prefactor of both expansions.
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        # Below the mode the power series for the lower function P converges
        # fast; Q = 1 - P is not small here, so the subtraction loses nothing.
        term = total = 1.0 / a
        n = a
        for _ in range(_MAX_ITER):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    # Above it, a continued fraction for Q itself (evaluated with Lentz's
    # method) keeps full relative accuracy however small Q gets.
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < _TINY:
            d = _TINY
        c = b + an / c
        if abs(c) < _TINY:
            c = _TINY
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return min(1.0, math.exp(log_front) * h)
