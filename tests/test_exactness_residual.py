"""The residual path of ``verify`` when p and q nearly cancel.

With p and q ~1e-3 apart in total variation a rejection happens about once
per thousand rows, and the token emitted then must follow the residual
r = max(0, p − q) / Σ max(0, p − q): a distribution far from p (it lives only
where p > q), computed from differences a thousand times smaller than the
probabilities themselves.  The overall law cannot see a wrong residual at
this gap (it moves it by ~1e-3 of 1e-3), so the law *given a rejection* is
checked directly, over thousands of rejections.

To get there cheaply, every call verifies ``GAMMA`` identical rows with
independent draft tokens drawn from q: each processed row is an independent
trial, and a call stops at its first rejection.
"""

from __future__ import annotations

import numpy as np
import pytest
from stats_helpers import assert_binomial, assert_matches_distribution, expected_distribution

from specdec_cpu import SamplingParams, sampling
from specdec_cpu.sampling import VERIFY_STREAM, Rng

GAMMA = 48
TV_TARGET = 1e-3
MIN_REJECTIONS = 2000


def near_pair(v: int, seed: int, params: SamplingParams):
    """Target logits and a draft q (float32, as the kernel receives it) with
    TV(p, q) ≈ 1e-3: the draft's logits are the target's plus a small
    perturbation scaled to that gap."""
    rng = np.random.default_rng(seed)
    target = (rng.normal(size=v) * 2.0).astype(np.float32)
    noise = rng.normal(size=v).astype(np.float32)
    p = expected_distribution(target, params=params)

    def q_for(eps: float) -> np.ndarray:
        return sampling.distribution((target + np.float32(eps) * noise).astype(np.float32), params)

    tv0 = 0.5 * np.abs(p - q_for(1e-3).astype(np.float64)).sum()
    q = q_for(1e-3 * TV_TARGET / tv0)
    return target, p, q


def run_calls(target: np.ndarray, q: np.ndarray, params: SamplingParams, n_calls: int, seed: int):
    """``n_calls`` verify calls of GAMMA rows; returns (first-row outcomes,
    residual outcomes, calls with a rejection, first alphas)."""
    v = target.size
    rows = np.ascontiguousarray(np.tile(target, (GAMMA + 1, 1)))
    q_rows = np.ascontiguousarray(np.tile(q, (GAMMA, 1)))
    q64 = q.astype(np.float64) / q.astype(np.float64).sum()
    drafts = np.random.default_rng(seed).choice(v, size=(n_calls, GAMMA), p=q64).astype(np.int32)
    rng = Rng(seed, VERIFY_STREAM)
    first = np.zeros(v, dtype=np.int64)
    residual = np.zeros(v, dtype=np.int64)
    rejected_calls = 0
    alpha0 = None
    for i in range(n_calls):
        res = sampling.verify(rows, drafts[i], q_rows, params, rng)
        if res.n_accepted < GAMMA:
            rejected_calls += 1
            residual[res.token] += 1
        first[drafts[i, 0] if res.n_accepted > 0 else res.token] += 1
        if alpha0 is None:
            alpha0 = float(res.alphas[0])
    return first, residual, rejected_calls, alpha0


def check_near_cancellation(v: int, params: SamplingParams, seed: int, n_calls: int) -> int:
    target, p, q = near_pair(v, seed, params)
    q64 = q.astype(np.float64)
    tv = 0.5 * np.abs(p - q64).sum()
    assert 0.5 * TV_TARGET < tv < 2 * TV_TARGET, tv
    alpha = 1.0 - tv

    first, residual, rejected, alpha0 = run_calls(target, q, params, n_calls, seed)
    print(f"V={v} {params}: TV {tv:.2e}, {rejected} rejections in {n_calls} calls of {GAMMA} rows")
    # Enough rejections to see the residual's law, at the rate the rule implies.
    assert rejected >= MIN_REJECTIONS
    assert_binomial(rejected, n_calls, 1.0 - alpha**GAMMA, what="calls with a rejection")
    assert alpha0 == pytest.approx(alpha, abs=2e-6)
    # The token emitted at a rejection follows max(0, p − q), by token id.
    r = np.maximum(p - q64, 0.0)
    assert_matches_distribution(residual, r / r.sum(), what="tokens emitted at a rejection")
    # And the first row's token, whatever happened, follows p.
    assert_matches_distribution(first, p, what="first-row tokens")
    return rejected


def test_residual_under_near_cancellation_full_vocabulary(isa):
    """No truncation: the residual is taken over the whole row by the
    vectorised kernel (one run per ISA)."""
    check_near_cancellation(64, SamplingParams(temperature=1.0), seed=81, n_calls=70_000)


def test_residual_under_near_cancellation_sorted_support():
    """top-k keeps 40 of 512 ids (< V/8): the kernel works on the sorted
    support list instead of the full row."""
    check_near_cancellation(512, SamplingParams(temperature=0.8, top_k=40), seed=82, n_calls=70_000)
