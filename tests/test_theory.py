"""The closed-form theory: the seed's worked example, limits, properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_cpu.planning import theory
from specdec_cpu.planning.theory import (
    ceiling,
    expected_tokens,
    max_useful_cost,
    optimal_gamma,
    plan_table,
    speedup,
    stationary_gamma,
)

# docs/math.md §8: Q4_K_M target, ms per decode call over k rows (compute-bound).
Q4KM_KS = [1, 2, 4, 6, 8, 16]
Q4KM_MS = [20.3, 37.1, 49.0, 73.8, 82.3, 126.0]


def q4km_curve(k_max: int = 17) -> np.ndarray:
    v = np.full(k_max + 1, np.nan)
    v[1:] = np.interp(np.arange(1, k_max + 1), Q4KM_KS, Q4KM_MS) / Q4KM_MS[0]
    return v


# ------------------------------------------------------------------ the seed's numbers

def test_seed_example_alpha_08():
    assert optimal_gamma(0.8, 0.1) == 6
    assert speedup(0.8, 6, 0.1) == pytest.approx(2.47, abs=0.005)
    best = speedup(0.8, 6, 0.1)
    for g in range(4, 9):
        assert speedup(0.8, g, 0.1) >= 0.97 * best, g


def test_seed_continuous_optimum():
    g = stationary_gamma(0.8, 0.1)
    # The seed quotes ≈ 5.6; the exact root of its equation is 5.756.
    assert g == pytest.approx(5.6, abs=0.2)
    a, c, L = 0.8, 0.1, -math.log(0.8)
    assert a ** (g + 1) * (L * (c * g + 1) + c) == pytest.approx(c, rel=1e-12)
    # ... and it is the maximiser of the continuous speed-up.
    grid = np.linspace(4, 8, 40001)
    assert grid[np.argmax(speedup(0.8, grid, 0.1))] == pytest.approx(g, abs=2e-4)


def test_seed_example_other_alphas():
    assert optimal_gamma(0.6, 0.1) == 3
    assert speedup(0.6, 3, 0.1) == pytest.approx(1.67, abs=0.005)
    g = optimal_gamma(0.4, 0.1)
    assert speedup(0.4, g, 0.1) == pytest.approx(1.30, abs=0.005)


def test_seed_ceilings():
    assert ceiling(0.8) == pytest.approx(5.0)
    assert ceiling(0.6) == pytest.approx(2.5)
    assert ceiling(1.0) == math.inf


# ------------------------------------------------------------------ expected tokens

def test_expected_tokens_matches_the_geometric_sum():
    for a in (0.0, 0.1, 0.5, 0.9, 0.999):
        for g in range(0, 12):
            assert expected_tokens(a, g) == pytest.approx(sum(a ** i for i in range(g + 1)), rel=1e-12)


def test_expected_tokens_limit_at_one_is_stable():
    assert expected_tokens(1.0, 7) == 8.0
    for eps in (1e-6, 1e-9, 1e-12, 1e-15):
        assert expected_tokens(1.0 - eps, 7) == pytest.approx(8.0, rel=1e-5)
        assert expected_tokens(1.0 - eps, 7) <= 8.0


def test_expected_tokens_broadcasts():
    out = expected_tokens(np.array([[0.5], [0.9]]), np.arange(4))
    assert isinstance(out, np.ndarray) and out.shape == (2, 4)
    assert out[0, 0] == 1.0 and out[1, 3] == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    assert isinstance(expected_tokens(0.5, 3), float)


# ------------------------------------------------------------------ speed-up and verify costs

@pytest.mark.parametrize("verify", [1.0, 3.0, lambda k: 10.0 * k, np.array([np.nan, 1.0, 2.0])])
def test_gamma_zero_is_exactly_one(verify):
    assert speedup(0.7, 0, 0.3, verify) == 1.0
    assert speedup(0.0, 0, 0.0, verify) == 1.0


def test_verify_cost_forms_agree():
    v = lambda k: 1.0 + 0.2 * (k - 1)  # noqa: E731
    arr = np.array([np.nan] + [v(k) for k in range(1, 10)])
    g = np.arange(9)
    from_callable = speedup(0.8, g, 0.1, v)
    np.testing.assert_allclose(from_callable, speedup(0.8, g, 0.1, arr), rtol=1e-15)
    expected = expected_tokens(0.8, g) / (g * 0.1 + np.array([1.0] + [v(k) for k in range(2, 10)]))
    np.testing.assert_allclose(from_callable, expected, rtol=1e-15)
    # A number is the same v for every k >= 2.
    assert speedup(0.8, 3, 0.1, 1.5) == pytest.approx(expected_tokens(0.8, 3) / (0.3 + 1.5))


def test_verify_cost_array_out_of_range_is_clear():
    with pytest.raises(ValueError, match=r"needs v\[4\]"):
        speedup(0.8, 3, 0.1, [np.nan, 1.0, 1.2, 1.3])
    with pytest.raises(ValueError, match="integer"):
        speedup(0.8, 1.5, 0.1, [np.nan, 1.0, 1.2, 1.3])


def test_verify_cost_must_be_positive():
    with pytest.raises(ValueError, match="verify_cost"):
        speedup(0.8, 2, 0.1, 0.0)
    with pytest.raises(ValueError, match="verify_cost"):
        speedup(0.8, 2, 0.1, lambda k: float("nan"))


@pytest.mark.parametrize("name,call", [
    ("alpha", lambda: speedup(1.2, 1, 0.1)),
    ("alpha", lambda: expected_tokens(-0.1, 1)),
    ("alpha", lambda: ceiling(float("nan"))),
    ("cost", lambda: speedup(0.5, 1, -0.1)),
    ("gamma", lambda: expected_tokens(0.5, -1)),
    ("alpha", lambda: optimal_gamma(np.array([0.5, 0.6]), 0.1)),
    ("gamma_max", lambda: optimal_gamma(0.5, 0.1, gamma_max=-1)),
])
def test_invalid_inputs_name_the_argument(name, call):
    with pytest.raises((ValueError, TypeError), match=name):
        call()


# ------------------------------------------------------------------ optimal γ

def test_optimal_gamma_zero_when_nothing_pays():
    assert optimal_gamma(0.0, 0.1) == 0
    assert optimal_gamma(0.3, 0.9) == 0
    assert optimal_gamma(0.0, 0.0) == 0  # every γ ties at 1: plain decoding
    assert optimal_gamma(0.9, 0.1, gamma_max=0) == 0


def test_optimal_gamma_backs_off_on_a_compute_bound_target():
    # Q4_K_M row of docs/math.md §8 with c = 0.25: speculation cannot pay at α = 0.7.
    assert optimal_gamma(0.7, 0.25, 12, q4km_curve()) == 0
    # ... while the seed's flat cost model would have speculated.
    assert optimal_gamma(0.7, 0.25, 12) > 0


def test_optimal_gamma_handles_non_monotone_curves():
    # Measured curves are not monotone (Q4_0: 6 rows slower than 8 rows).
    v = np.array([np.nan, 1.0, 1.86, 2.2, 2.6, 3.5, 4.79, 4.6, 4.36])
    s = speedup(0.95, np.arange(8), 0.05, v)
    assert optimal_gamma(0.95, 0.05, 7, v) == int(np.argmax(s))


# ------------------------------------------------------------------ stationary γ

def test_stationary_gamma_errors_say_why():
    with pytest.raises(ValueError, match="alpha = 0"):
        stationary_gamma(0.0, 0.1)
    with pytest.raises(ValueError, match="alpha = 1"):
        stationary_gamma(1.0, 0.1)
    with pytest.raises(ValueError, match="cost = 0"):
        stationary_gamma(0.8, 0.0)
    with pytest.raises(ValueError, match="plain decoding is best"):
        stationary_gamma(0.8, max_useful_cost(0.8))
    with pytest.raises(ValueError, match="plain decoding is best"):
        stationary_gamma(0.5, 0.9)


def test_stationary_gamma_near_the_boundary_is_small_and_positive():
    c = max_useful_cost(0.8) * (1 - 1e-6)
    g = stationary_gamma(0.8, c)
    assert 0.0 < g < 1e-3


def test_max_useful_cost_is_the_slope_condition_at_zero():
    for a in (0.2, 0.5, 0.8, 0.95):
        c = max_useful_cost(a)
        h = 1e-6
        assert speedup(a, h, c * 0.99) > speedup(a, 1e-9, c * 0.99)
        assert speedup(a, h, c * 1.01) < speedup(a, 1e-9, c * 1.01)


# ------------------------------------------------------------------ plan table

def test_plan_table_rows():
    rows = plan_table(0.8, 0.1, 12)
    assert [r.gamma for r in rows] == list(range(13))
    assert rows[0].expected_tokens == 1.0 and rows[0].speedup == 1.0
    assert rows[6].pct_of_best == pytest.approx(100.0)
    assert max(r.pct_of_best for r in rows) == pytest.approx(100.0)
    assert rows[8].pct_of_best > 97.0


# ------------------------------------------------------------------ properties

alphas = st.floats(0.0, 1.0, allow_nan=False)
costs = st.floats(0.0, 2.0, allow_nan=False)
gammas = st.integers(0, 40)


@settings(max_examples=300, deadline=None)
@given(a1=alphas, a2=alphas, c=costs)
def test_gamma_star_rises_with_alpha(a1, a2, c):
    lo, hi = sorted((a1, a2))
    assert optimal_gamma(lo, c) <= optimal_gamma(hi, c)


@settings(max_examples=300, deadline=None)
@given(a=alphas, c1=costs, c2=costs)
def test_gamma_star_falls_with_cost(a, c1, c2):
    lo, hi = sorted((c1, c2))
    assert optimal_gamma(a, lo) >= optimal_gamma(a, hi)


@settings(max_examples=300, deadline=None)
@given(a=alphas, c=costs, v=st.floats(0.5, 10.0))
def test_speedup_at_zero_is_one(a, c, v):
    assert speedup(a, 0, c, v) == 1.0


@settings(max_examples=300, deadline=None)
@given(a=alphas, g=gammas)
def test_expected_tokens_bounds(a, g):
    e = expected_tokens(a, g)
    assert 1.0 <= e <= min(g + 1, ceiling(a))


@settings(max_examples=200, deadline=None)
@given(a=alphas, c=costs, slope=st.floats(0.0, 1.0))
def test_optimal_gamma_is_the_best(a, c, slope):
    v = lambda k: 1.0 + slope * (k - 1)  # noqa: E731
    g = optimal_gamma(a, c, 12, v)
    s = speedup(a, np.arange(13), c, v)
    assert s[g] >= s.max() * (1 - 1e-12)
    assert s[g] >= 1.0


def test_module_exports():
    for name in theory.__all__:
        assert hasattr(theory, name)
