"""Acceptance of prompt-lookup drafts per match length, and how the policy drafts with it.

The promise: long drafts inside a copy (long matches), none on a chance
match, learning from every step that had a match (drafted or not), and
guesses between disagreeing occurrences kept apart from clear matches.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from specdec_cpu.planning import CostModel, MatchAlphas
from specdec_cpu.planning.policy import NGRAM, Candidate, DraftPolicy

FLAT = [50.0 * (1 + 0.08 * (k - 1)) for k in range(1, 66)]  # a memory-bound target, ms


class Match(NamedTuple):  # what NgramDrafter.match returns, as the policy reads it
    length: int
    position: int
    unanimous: bool
    token: int


def teach(alphas: MatchAlphas, length, hit_rate, n, rng, unanimous=True):
    """n steps at one match length whose predicted token was emitted with probability hit_rate."""
    for _ in range(n):
        alphas.record_prediction(length, unanimous, bool(rng.random() < hit_rate))


def lookup_gamma(pol: DraftPolicy, length: int, unanimous: bool = True) -> int:
    cand = Candidate(plan=pol.admit(), gamma="auto", room=64, remaining=100,
                     match=Match(length, 0, unanimous, 7), lookup_max=24)
    d = pol.plan([cand])[0]
    return d.gamma if d.route == NGRAM else 0


def policy(curve=FLAT) -> DraftPolicy:
    return DraftPolicy(CostModel(target_ms=list(curve), draft_ms=10.0), max_rows=64, max_draft_rows=64,
                       has_draft=False, gamma_max=12)


def test_long_matches_draft_long_and_chance_matches_not_at_all():
    rng = np.random.default_rng(0)
    pol = policy()
    teach(pol.match_alphas, 1, 0.02, 60, rng)
    for length in (30, 40, 50, 60, 70):
        teach(pol.match_alphas, length, 0.99, 40, rng)
    assert lookup_gamma(pol, 1) == 0
    assert lookup_gamma(pol, 70) >= 16  # a flat curve and α ≈ 0.99: draft far
    assert pol.match_alphas.alpha_at(1) < 0.1 < 0.9 < pol.match_alphas.alpha_at(70)


def test_plain_steps_teach_only_through_the_token_they_emitted():
    rng = np.random.default_rng(1)
    alphas = MatchAlphas()
    prior = alphas.alpha_at(6)
    teach(alphas, 6, 1.0, 30, rng)
    assert alphas.alpha_at(6) > max(prior, 0.95)
    teach(alphas, 6, 0.0, 60, rng)
    assert alphas.alpha_at(6) < 0.2  # it forgets: content changes


def test_the_policy_learns_a_prediction_only_from_a_step_that_had_a_match():
    pol = policy([20.0 * (1 + 0.9 * (k - 1)) for k in range(1, 66)])  # compute-bound: a poor copy is not drafted
    before = pol.match_alphas.alpha_at(3)
    cand = Candidate(plan=pol.admit(), gamma=0, room=64, remaining=100, match=None)
    pol.learn(cand, pol.plan([cand])[0], None, (), 5)
    assert pol.match_alphas.alpha_at(3) == before
    pol.match_alphas.record_rows(3, True, [0.0] * 6)  # copies at length 3 have been rejected: it plans plain
    before = pol.match_alphas.alpha_at(3)
    matched = Candidate(plan=pol.admit(), gamma="auto", room=64, remaining=100, match=Match(3, 0, True, 7),
                        lookup_max=24)
    d = pol.plan([matched])[0]
    assert d.gamma == 0 and d.match is not None
    pol.learn(matched, d, None, (), 8)  # the emitted token was not the predicted one
    assert pol.match_alphas.alpha_at(3) < before


def test_drafted_rows_count_at_the_length_each_was_verified_at():
    alphas = MatchAlphas()
    before = {n: alphas.alpha_at(n) for n in (2, 3, 4, 5)}
    split_before = alphas.alpha_at(2, unanimous=False)
    alphas.record_rows(2, False, [1.0, 1.0, 0.0])
    assert alphas.alpha_at(2, unanimous=False) > split_before  # row 0: a split match of length 2
    assert alphas.alpha_at(2) == before[2]
    assert alphas.alpha_at(3) > before[3]  # row 1: the copy picked its source, length 3
    assert alphas.alpha_at(4) < before[4]  # row 2 was rejected
    assert alphas.alpha_at(5) == before[5]


def test_disagreeing_occurrences_have_their_own_acceptance():
    rng = np.random.default_rng(2)
    pol = policy()
    teach(pol.match_alphas, 3, 0.95, 60, rng, unanimous=True)
    teach(pol.match_alphas, 3, 0.05, 60, rng, unanimous=False)
    assert pol.match_alphas.alpha_at(3) > 0.85 and pol.match_alphas.alpha_at(3, unanimous=False) < 0.15
    assert lookup_gamma(pol, 3, unanimous=False) == 0
    assert lookup_gamma(pol, 3, unanimous=True) > 0


def test_steep_costs_keep_even_long_matches_short():
    steep = [20.0 * (1 + 0.9 * (k - 1)) for k in range(1, 66)]  # a compute-bound target
    rng = np.random.default_rng(3)
    compute, memory = policy(steep), policy()
    for pol in (compute, memory):
        teach(pol.match_alphas, 40, 0.97, 60, rng)
    assert 0 < lookup_gamma(compute, 40) < lookup_gamma(memory, 40)


def test_bad_settings():
    for kw in ({"memory": 0.0}, {"memory": 1.5}, {"prior_weight": 0.0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            MatchAlphas(**kw)
