"""Closed-form speculative decoding theory: acceptance, speed-up, optimal γ.

Notation (docs/math.md §7–§8):

- α: per-position acceptance probability, α = Σ min(p, q) = 1 − TV(p, q).
- γ: number of drafted tokens per step; one target pass verifies k = γ + 1 rows.
- c: cost of one draft token relative to one single-row target pass,
  c = T_draft(1) / T_target(1).
- v(k): cost of a target pass over k rows relative to one row,
  v(k) = T_target(k) / T_target(1), so v(1) = 1 by definition.

A step emits E[tokens] = (1 − α^(γ+1)) / (1 − α) tokens and costs γ·c + v(γ+1)
single-row target passes, so ``speedup = E / (γ·c + v(γ+1))`` relative to plain
decoding (γ = 0: one token for one pass, speed-up exactly 1).

The functions accept scalars or numpy arrays (broadcast together) and return a
float for scalar inputs, an ndarray otherwise.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Union

import numpy as np
from numpy.typing import ArrayLike

VerifyCost = Union[float, Callable[[float], float], ArrayLike]  # a callable gets an int k where k is whole

__all__ = [
    "PlanRow",
    "VerifyCost",
    "ceiling",
    "expected_tokens",
    "max_useful_cost",
    "optimal_gamma",
    "plan_table",
    "speedup",
    "stationary_gamma",
]

# Speed-ups within this relative distance of the best count as ties; ties go
# to the smaller γ (cheaper, and never "speculation" for a rounding error).
_TIE_RTOL = 1e-12


class PlanRow(NamedTuple):
    """One row of a plan table."""

    gamma: int
    expected_tokens: float
    speedup: float
    pct_of_best: float


def expected_tokens(alpha: ArrayLike, gamma: ArrayLike) -> Union[float, np.ndarray]:
    """Expected tokens emitted per step: (1 − α^(γ+1)) / (1 − α).

    The limit at α = 1 is γ + 1.  Computed as expm1((γ+1)·ln α) / expm1(ln α),
    which stays accurate as α → 1 where the textbook form cancels.
    """
    a = _unit("alpha", alpha)
    g = _nonneg("gamma", gamma)
    scalar = a.ndim == 0 and g.ndim == 0
    a, g = np.broadcast_arrays(a, g)
    n = g + 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        log_a = np.log(a)  # -inf at α = 0: expm1(-inf) = -1, ratio 1 (correct)
        e = np.expm1(n * log_a) / np.expm1(log_a)
        e = np.where(a == 1.0, n, e)
        # Clip away last-ulp excursions so E ≤ min(γ+1, 1/(1−α)) holds exactly.
        e = np.minimum(e, n)
        e = np.where(a < 1.0, np.minimum(e, 1.0 / (1.0 - a)), e)
    e = np.maximum(e, 1.0)
    return _out(e, scalar)


def ceiling(alpha: ArrayLike) -> Union[float, np.ndarray]:
    """The limit of E[tokens] as γ → ∞: 1 / (1 − α) (infinite at α = 1)."""
    a = _unit("alpha", alpha)
    with np.errstate(divide="ignore"):
        c = np.where(a < 1.0, 1.0 / (1.0 - a), np.inf)
    return _out(c, a.ndim == 0)


def speedup(alpha: ArrayLike, gamma: ArrayLike, cost: ArrayLike,
            verify_cost: VerifyCost = 1.0) -> Union[float, np.ndarray]:
    """Speed-up over plain decoding: E[tokens](α, γ) / (γ·c + v(γ+1)).

    Args:
        alpha: acceptance probability in [0, 1].
        gamma: draft length(s) ≥ 0.
        cost: c = T_draft(1) / T_target(1), ≥ 0.
        verify_cost: v(k) for k = γ + 1 rows, as a number (the same for every
            k ≥ 2), a callable ``v(k)``, or an array indexed by k (``v[k]``;
            ``v[0]`` is unused and ``v[1]`` should be 1).  Non-number forms
            need integer γ.

    At γ = 0 the result is exactly 1 whatever ``verify_cost`` says: plain
    decoding emits one token for one single-row pass, and v(1) = 1 by definition.
    """
    a = _unit("alpha", alpha)
    g = _nonneg("gamma", gamma)
    c = _nonneg("cost", cost)
    scalar = a.ndim == 0 and g.ndim == 0 and c.ndim == 0
    a, g, c = np.broadcast_arrays(a, g, c)
    e = np.asarray(expected_tokens(a, g), dtype=float)
    v = np.ones(g.shape)
    spec = g > 0
    if np.any(spec):
        v[spec] = _verify_values(verify_cost, g[spec] + 1.0)
    s = np.where(spec, e / (g * c + v), 1.0)
    return _out(s, scalar)


def optimal_gamma(alpha: float, cost: float, gamma_max: int = 16,
                  verify_cost: VerifyCost = 1.0) -> int:
    """The integer γ in 0..gamma_max with the largest speed-up.

    Returns 0 (plain decoding) when no γ beats a speed-up of 1.  Near-ties go
    to the smaller γ.  Works for any verify-cost curve, including measured
    ones that are not monotone, by evaluating every candidate.
    """
    _scalar_arg("alpha", alpha)
    _scalar_arg("cost", cost)
    gammas = np.arange(_gamma_max(gamma_max) + 1)
    s = np.asarray(speedup(alpha, gammas, cost, verify_cost), dtype=float)
    return _best_index(s)


def max_useful_cost(alpha: float) -> float:
    """The draft cost c below which speculation helps for a flat v = 1.

    The slope of the speed-up at γ = 0 has the sign of α·(L + c) − c with
    L = −ln α (see :func:`stationary_gamma`), which is positive exactly when
    c < α·L / (1 − α).  The bound is 0 at α = 0 and tends to 1 as α → 1.
    """
    a = float(_unit("alpha", alpha))
    if a == 0.0:
        return 0.0
    if a == 1.0:
        return 1.0
    return -a * math.log(a) / (1.0 - a)


def stationary_gamma(alpha: float, cost: float) -> float:
    """The continuous optimum of the speed-up for a flat verify cost v = 1.

    Setting the derivative of E(γ) / (c·γ + 1) to zero gives
    α^(γ+1)·[L·(c·γ + 1) + c] = c with L = −ln α.  The left side minus c,
    f(γ), is strictly decreasing (f'(γ) = −L²·(c·γ + 1)·α^(γ+1) < 0) and tends
    to −c, so there is exactly one root on γ > 0 iff f(0) > 0, i.e.
    c < α·L / (1 − α) (:func:`max_useful_cost`).

    Raises:
        ValueError: when there is no interior optimum: α = 0 (nothing is ever
            accepted), α = 1 or c = 0 (the speed-up grows for ever), or
            c ≥ α·L / (1 − α) (the speed-up falls from γ = 0: plain decoding
            is best).
    """
    a = float(_scalar_arg("alpha", alpha))
    c = float(_scalar_arg("cost", cost))
    if a == 0.0:
        raise ValueError("no interior optimum: alpha = 0, drafts are never accepted (plain decoding is best)")
    if a == 1.0:
        raise ValueError("no interior optimum: alpha = 1, the speed-up grows with gamma without bound")
    if c == 0.0:
        raise ValueError("no interior optimum: cost = 0, the speed-up grows with gamma "
                         f"towards the ceiling {1.0 / (1.0 - a):.4g}")
    c_max = max_useful_cost(a)
    if c >= c_max:
        raise ValueError(f"no interior optimum: cost {c:.4g} >= alpha*(-ln alpha)/(1-alpha) = {c_max:.4g} "
                         f"at alpha = {a:.4g}, so the speed-up falls from gamma = 0 "
                         "(plain decoding is best)")
    log_a = -math.log(a)

    def f(g: float) -> float:
        return a ** (g + 1.0) * (log_a * (c * g + 1.0) + c) - c

    lo, hi = 0.0, 1.0
    while f(hi) > 0.0:  # f → −c < 0, so this terminates
        lo, hi = hi, hi * 2.0
    # Bisection: f is monotone, so this is robust and 100 halvings reach ulp level.
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if f(mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def plan_table(alpha: float, cost: float, gamma_max: int = 12,
               verify_cost: VerifyCost = 1.0) -> list[PlanRow]:
    """Rows (γ, E[tokens], speed-up, % of best) for γ = 0..gamma_max."""
    _scalar_arg("alpha", alpha)
    _scalar_arg("cost", cost)
    gammas = np.arange(_gamma_max(gamma_max) + 1)
    e = np.asarray(expected_tokens(alpha, gammas), dtype=float)
    s = np.asarray(speedup(alpha, gammas, cost, verify_cost), dtype=float)
    best = float(s.max())
    return [PlanRow(int(g), float(ei), float(si), 100.0 * float(si) / best)
            for g, ei, si in zip(gammas, e, s)]


# ---------------------------------------------------------------- helpers

def _best_index(s: np.ndarray) -> int:
    best = float(np.max(s))
    return int(np.argmax(s >= best * (1.0 - _TIE_RTOL)))


def _verify_values(verify_cost: VerifyCost, k: np.ndarray) -> np.ndarray:
    """v(k) for an array of row counts k ≥ 2, validated to be positive and finite."""
    if callable(verify_cost):
        vals = np.array([float(verify_cost(_as_index(x))) for x in k.ravel()]).reshape(k.shape)
    else:
        arr = np.asarray(verify_cost, dtype=float)
        if arr.ndim == 0:
            vals = np.full(k.shape, float(arr))
        elif arr.ndim == 1:
            if not np.all(k == np.round(k)):
                raise ValueError("gamma must be an integer when verify_cost is an array indexed by k")
            idx = k.astype(np.int64)
            too_big = idx >= arr.shape[0]
            if np.any(too_big):
                raise ValueError(
                    f"verify_cost array has entries v[k] for k < {arr.shape[0]} but gamma = "
                    f"{int(idx[too_big].max()) - 1} needs v[{int(idx[too_big].max())}] "
                    "(k = gamma + 1 rows; pass a longer array or a smaller gamma_max)")
            vals = arr[idx]
        else:
            raise ValueError(f"verify_cost array must be 1-D (v[k]), got shape {arr.shape}")
    if not np.all(np.isfinite(vals)) or np.any(vals <= 0.0):
        raise ValueError(f"verify_cost must be positive and finite, got {vals.ravel().tolist()}")
    return vals


def _as_index(x: float) -> Union[int, float]:
    return int(x) if float(x).is_integer() else float(x)


def _unit(name: str, value: ArrayLike) -> np.ndarray:
    arr = _real(name, value)
    if np.any((arr < 0.0) | (arr > 1.0)):
        raise ValueError(f"{name} must be in [0, 1], got {_show(arr)}")
    return arr


def _nonneg(name: str, value: ArrayLike) -> np.ndarray:
    arr = _real(name, value)
    if np.any(arr < 0.0):
        raise ValueError(f"{name} must be >= 0, got {_show(arr)}")
    return arr


def _real(name: str, value: ArrayLike) -> np.ndarray:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number or an array of them, got {value!r}") from None
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {_show(arr)}")
    return arr


def _scalar_arg(name: str, value: ArrayLike) -> float:
    arr = _unit(name, value) if name == "alpha" else _nonneg(name, value)
    if arr.ndim != 0:
        raise TypeError(f"{name} must be a scalar here, got an array of shape {arr.shape}")
    return float(arr)


def _gamma_max(gamma_max: int) -> int:
    if isinstance(gamma_max, bool) or not isinstance(gamma_max, (int, np.integer)) or gamma_max < 0:
        raise ValueError(f"gamma_max must be an int >= 0, got {gamma_max!r}")
    return int(gamma_max)


def _show(arr: np.ndarray) -> str:
    return repr(float(arr)) if arr.ndim == 0 else repr(arr.tolist() if arr.size <= 8 else arr)


def _out(x: np.ndarray, scalar: bool) -> Union[float, np.ndarray]:
    return float(x) if scalar else np.asarray(x, dtype=float)
