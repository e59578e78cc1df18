"""The draft policy at one sequence: the seed's single-stream rule as the K = 1
case of the batch optimisation, and its behaviour on synthetic machines.

``Machine`` plays one sequence's steps the way the step loop runs them:
it asks the policy for a plan, charges the passes the plan costs (a draft
pass per depth, the draft's catch-up in the first, one target pass), draws
acceptances, and hands the outcome back (``learn``, pass times, the step).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import pytest

from specdec_cpu.planning import CostModel, theory
from specdec_cpu.planning.policy import (
    ALPHA_GUESS,
    CATCH_UP_PAYBACK,
    EXPECTED_TOKENS,
    EXPECTED_TOKENS_ALONE,
    MODEL,
    PROBE_GAMMA,
    Candidate,
    DraftPolicy,
)

# docs/math.md §8 curves (ms per pass over k rows, all rows' logits), k = 1..17.
KS = [1, 2, 4, 6, 8, 16]
Q4KM = np.interp(np.arange(1, 18), KS, [20.3, 37.1, 49.0, 73.8, 82.3, 126.0])  # compute-bound
F32 = np.interp(np.arange(1, 18), KS, [64.8, 69.7, 78.8, 85.9, 104.0, 156.0])  # memory-bound


def policy(curve: Optional[Sequence[float]], c: float = 0.2, alpha: Optional[float] = None,
           gamma_max: int = 12, **kw) -> DraftPolicy:
    cost = None if curve is None else CostModel(target_ms=list(curve), draft_ms=c * curve[0], alpha=alpha)
    return DraftPolicy(cost, max_rows=64, max_draft_rows=512, has_draft=True, gamma_max=gamma_max, **kw)


class Machine:
    """One sequence on a synthetic machine: ``t_ms(k)`` per target pass, a
    draft pass over k rows ``d_ms·(1 + 0.25·(k − 1))`` (the default draft's
    shape: 128 rows cost ~30 one-row passes), ``rows_of(γ)`` the rows' α."""

    def __init__(self, pol: DraftPolicy, t_ms: Callable[[int], float], d_ms: float,
                 rows_of: Callable[[int], list[float]], rng, gamma="auto", lag: int = 1) -> None:
        self.pol, self.t_ms, self.d_ms, self.rows_of, self.rng = pol, t_ms, d_ms, rows_of, rng
        self.plan, self.gamma, self.lag = pol.admit(), gamma, lag
        self.tokens, self.ms, self.gammas, self.probes, self.catch_up = 0, 0.0, [], 0, 0

    def step(self) -> int:
        pol = self.pol
        cand = Candidate(plan=self.plan, gamma=self.gamma, room=64, remaining=10_000, draft_lag=self.lag)
        d = pol.plan([cand], catch_up_budget=128)[0]
        rate, ms = pol.last_rate, 0.0
        if d.catch_up:
            ms += self._draft_pass(d.catch_up)
            self.lag -= d.catch_up
            self.catch_up += d.catch_up
        g = d.gamma if d.route == MODEL else 0
        rows: list[float] = []
        n_acc = 0
        if g:
            ms += self._draft_pass(self.lag) + sum(self._draft_pass(1) for _ in range(g - 1))
            alphas = self.rows_of(g)
            accepted = self.rng.random(g) < np.asarray(alphas)
            n_acc = g if accepted.all() else int(np.argmin(accepted))
            rows = list(alphas[:n_acc + 1]) if n_acc < g else list(alphas)
            self.lag = 2 if n_acc == g else 1
        else:
            self.lag += 1
        t = self.t_ms(g + 1)
        pol.observe_target(g + 1, t / 1000)
        ms += t
        pol.learn(cand, d, MODEL if g else None, rows, 0)
        pol.observe_step(1, g > 0, d.catch_up > 0, d.explore, rate, n_acc + 1, ms / 1000)
        self.tokens += n_acc + 1
        self.ms += ms
        self.gammas.append(g)
        self.probes += d.probe
        return g

    def _draft_pass(self, rows: int) -> float:
        ms = self.d_ms * (1 + 0.25 * (max(rows, 1) - 1))
        self.pol.observe_draft(rows, ms / 1000)
        return ms

    def run(self, steps: int) -> float:
        for _ in range(steps):
            self.step()
        return self.tokens / self.ms  # tokens per ms


def steady(alpha: float) -> Callable[[int], list[float]]:
    return lambda g: [alpha] * g


# ---------------------------------------------------------------- K = 1 is the seed's rule


@pytest.mark.parametrize("alpha,c,slope", [(0.9, 0.05, 0.0), (0.8, 0.1, 0.1), (0.7, 0.25, 0.8),
                                           (0.97, 0.2, 0.4), (0.5, 0.01, 0.0), (0.95, 0.28, 0.08)])
def test_one_sequence_plans_the_single_stream_optimum(alpha, c, slope):
    """γ* = argmax E[tokens](α, γ) / (γ·c + v(γ+1)) (theory.optimal_gamma), 0 where
    nothing beats plain decoding by the planner's 2% margin."""
    curve = 20.0 * (1.0 + slope * np.arange(17))
    pol = policy(curve, c, alpha=alpha)
    d = pol.plan([Candidate(plan=pol.admit(), gamma="auto", room=64, remaining=100, draft_lag=1)])[0]
    v = np.concatenate([[np.nan], curve / curve[0]])
    best = theory.optimal_gamma(alpha, c, 12, v)
    if float(theory.speedup(alpha, best, c, v)) < 1.02:
        best = 0
    assert (d.gamma if d.route == MODEL else 0) == best


def test_flat_costs_draft_long_and_steep_costs_decode_plain():
    flat = policy(np.full(17, 50.0), 0.05, alpha=0.9)
    assert flat.plan([Candidate(plan=flat.admit(), gamma="auto", room=64, remaining=100, draft_lag=1)])[0].gamma >= 8
    steep = policy(Q4KM, 0.25, alpha=0.7)
    assert steep.plan([Candidate(plan=steep.admit(), gamma="auto", room=64, remaining=100,
                                 draft_lag=1)])[0].gamma == 0


# ---------------------------------------------------------------- on synthetic machines


@pytest.mark.parametrize("with_model", [True, False])
def test_never_slower_than_plain_on_a_compute_bound_pair(with_model):
    rng = np.random.default_rng(1)
    m = Machine(policy(Q4KM if with_model else None, 0.68), lambda k: Q4KM[k - 1], 0.68 * Q4KM[0], steady(0.7), rng)
    assert m.run(2000) * Q4KM[0] >= 0.97


@pytest.mark.parametrize("with_model", [True, False])
def test_close_to_the_best_fixed_gamma_on_a_memory_bound_pair(with_model):
    def machine(gamma, seed):
        rng = np.random.default_rng(seed)
        pol = policy(F32 if with_model else None, 0.2)
        return Machine(pol, lambda k: F32[k - 1], 0.2 * F32[0], steady(0.9), rng, gamma=gamma)

    auto = machine("auto", 2).run(2000)
    best = max(machine(g, 3).run(2000) for g in (2, 4, 6, 8))
    assert auto >= 0.95 * best


def test_a_guessed_acceptance_is_explored_at_once_and_replaced():
    """Without a measured α the first step that may draft probes (where drafting
    could pay at all), and the first rows replace the guess by their mean."""
    rng = np.random.default_rng(4)
    pol = policy(F32, 0.2)  # pass times known, α not
    assert pol.pair_alpha.first == ALPHA_GUESS
    m = Machine(pol, lambda k: F32[k - 1], 0.2 * F32[0], steady(0.95), rng)
    first = m.step()
    assert first == PROBE_GAMMA and m.probes == 1
    for _ in range(4):
        m.step()
    assert pol.pair_alpha.first > 0.85
    assert m.gammas[-1] == policy(F32, 0.2, alpha=0.95).plan(
        [Candidate(plan=policy(F32, 0.2, alpha=0.95).admit(), gamma="auto", room=64, remaining=100,
                   draft_lag=1)])[0].gamma


def test_one_unlucky_first_row_does_not_stop_the_exploring():
    """At T = 0 a row's α is 0 or 1: a first probe that met a 0 would leave the
    pair at half the guess, and a good draft idle.  The policy explores again
    at each step that would not draft, until EXPLORE_ROWS first rows."""
    rng = np.random.default_rng(6)
    calls = {"n": 0}

    def rows(g: int) -> list[float]:
        calls["n"] += 1
        return [0.0] * g if calls["n"] == 1 else [1.0] * g  # greedy: the draft agrees from then on

    pol = policy(F32, 0.3)  # a costlier draft than the default: at α̂ = 0.35 drafting would not pay
    m = Machine(pol, lambda k: F32[k - 1], 0.3 * F32[0], rows, rng)
    m.run(8)
    assert m.gammas[0] == PROBE_GAMMA and m.probes >= 2  # explored again after the 0
    assert max(m.gammas) > PROBE_GAMMA and pol.pair_alpha.first > ALPHA_GUESS


def test_no_probes_where_even_perfect_acceptance_cannot_pay():
    """A compute-bound target with a costly draft (c = 0.68): a probe would only
    cost the draft's passes, so none are made, not even to replace the guess."""
    rng = np.random.default_rng(5)
    m = Machine(policy(Q4KM, 0.68, probe_every=4), lambda k: Q4KM[k - 1], 0.68 * Q4KM[0], steady(0.95), rng)
    m.run(200)
    assert set(m.gammas) == {0} and m.probes == 0


def test_probes_bring_drafting_back_after_a_content_change():
    rng = np.random.default_rng(0)
    state = {"alpha": 0.4}
    m = Machine(policy(F32, 0.2, probe_every=8), lambda k: F32[k - 1], 0.2 * F32[0],
                lambda g: [state["alpha"]] * g, rng)
    m.run(300)
    plain_share = m.gammas[-100:].count(0) / 100
    assert plain_share > 0.8  # low acceptance: mostly plain, with backing-off probes
    state["alpha"] = 0.97
    m.gammas.clear()
    m.run(300)
    assert max(m.gammas) > PROBE_GAMMA and m.gammas[-50:].count(0) < 10


def test_correlated_acceptance_earns_longer_drafts():
    """A draft whose later tokens are accepted whenever its first is gets longer
    drafts than an i.i.d. one accepted more often on its first token."""
    def last_gamma(rows_of) -> int:
        m = Machine(policy(50.0 * (1 + 0.05 * np.arange(65)), 0.0, alpha=0.6), lambda k: 50.0 * (1 + 0.05 * (k - 1)),
                    1e-3, rows_of, np.random.default_rng(6))
        m.run(300)
        return max(m.gammas[-20:])

    correlated = last_gamma(lambda g: [0.5] + [0.98] * (g - 1))
    iid = last_gamma(steady(0.62))
    assert correlated > iid >= 1


def test_a_long_lag_catches_up_only_when_the_drafting_it_enables_repays_it():
    """A draft far behind (a long prompt) catches up when drafting then repays
    it within the horizon: EXPECTED_TOKENS of the sequence's tokens in a
    batch (a drafting stretch there is short), EXPECTED_TOKENS_ALONE alone
    (only its finish or an arrival ends the stretch).  A good cheap draft on
    a memory-bound pair catches up 200 tokens either way; a middling one
    (c = 0.3, α = 0.8) repays 100 or 200 tokens within a few hundred of its
    own: alone it catches up, in a batch of two not even 100, and alone not
    a lag of 1,000, however long the sequence may still run."""
    def alone(c: float, alpha: float, lag: int) -> int:
        pol = policy(F32, c, alpha=alpha)
        m = Machine(pol, lambda k: F32[k - 1], c * F32[0], steady(alpha), np.random.default_rng(7), lag=lag)
        m.run(3)
        return m.catch_up

    def in_pair(c: float, alpha: float, lag: int) -> int:
        pol = policy(F32, c, alpha=alpha)
        pair = [Candidate(plan=pol.admit(), gamma="auto", room=64, remaining=10_000, draft_lag=lag) for _ in range(2)]
        return sum(d.catch_up for d in pol.plan(pair, catch_up_budget=128))

    assert alone(0.1, 0.97, 200) > 0 and in_pair(0.1, 0.97, 200) > 0
    assert alone(0.3, 0.8, 100) > 0 and alone(0.3, 0.8, 200) > 0
    assert in_pair(0.3, 0.8, 100) == 0  # it would at the alone horizon
    assert alone(0.3, 0.8, 1000) == 0
    # the horizons these cases are set against
    assert (EXPECTED_TOKENS, EXPECTED_TOKENS_ALONE, CATCH_UP_PAYBACK) == (64, 256, 1.5)


def test_the_catch_up_horizon_is_the_sequence_remaining_tokens_when_fewer():
    """A sequence with few tokens left does not catch up a long lag even where a
    long one would: the saving is counted over at most its remaining tokens."""
    pol = policy(F32, 0.2, alpha=0.95)
    long_life = Candidate(plan=pol.admit(), gamma="auto", room=64, remaining=10_000, draft_lag=100)
    assert pol.plan([long_life], catch_up_budget=128)[0].catch_up > 0
    pol = policy(F32, 0.2, alpha=0.95)
    short_life = Candidate(plan=pol.admit(), gamma="auto", room=3, remaining=4, draft_lag=100)
    assert pol.plan([short_life], catch_up_budget=128)[0].catch_up == 0


def test_a_fixed_gamma_beyond_gamma_max_drafts_as_asked():
    pol = policy(F32, 0.2, alpha=0.9, gamma_max=3)
    d = pol.plan([Candidate(plan=pol.admit(), gamma=6, room=64, remaining=100, draft_lag=1)])[0]
    assert (d.route, d.gamma) == (MODEL, 6)
    auto = pol.plan([Candidate(plan=pol.admit(), gamma="auto", room=64, remaining=100, draft_lag=1)])[0]
    assert auto.gamma <= 3


def test_a_constrained_sequence_takes_a_few_forced_tokens_of_lag_in_its_drafting_step():
    """A grammar's forced tokens leave the draft behind by a few tokens after
    steps that did not run it: a constrained sequence takes up to
    IN_STEP_LAG_CONSTRAINED of lag in its drafting step (charged to the
    plan) instead of a plain step to catch up."""
    from specdec_cpu.planning.policy import IN_STEP_LAG, IN_STEP_LAG_CONSTRAINED

    lag = IN_STEP_LAG + 4
    assert lag <= IN_STEP_LAG_CONSTRAINED
    for constrained, drafts in ((False, False), (True, True)):
        pol = policy(F32, 0.2, alpha=0.95)
        d = pol.plan([Candidate(plan=pol.admit(), gamma="auto", room=64, remaining=100, draft_lag=lag,
                                constrained=constrained)], catch_up_budget=128)[0]
        assert (d.route == MODEL and d.gamma > 0) == drafts, (constrained, d)
