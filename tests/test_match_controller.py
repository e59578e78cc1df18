"""The γ controller of prompt-lookup drafts: α learnt per match length.

Its promise: long drafts inside a copy (long matches), none on a chance
match, learning from every step that had a match (drafted or not), and
guesses between disagreeing occurrences kept apart from clear matches.
"""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cpu.planning import CostModel, MatchLengthController

FLAT = [50.0 * (1 + 0.08 * (k - 1)) for k in range(1, 26)]  # a memory-bound target, ms


def controller(**kw) -> MatchLengthController:
    kw.setdefault("gamma_max", 24)
    return MatchLengthController(CostModel(target_ms=FLAT, draft_ms=0.0), **kw)


def teach(ctrl, length, hit_rate, n, rng, unanimous=True):
    """n plain steps at one match length whose predicted token was emitted
    with probability hit_rate."""
    for _ in range(n):
        ctrl.next_gamma(length, 7, unanimous)
        ctrl.observe(0, (), 0, None, FLAT[0] / 1000)
        ctrl.emitted(7 if rng.random() < hit_rate else 8)


def test_long_matches_draft_long_and_chance_matches_not_at_all():
    rng = np.random.default_rng(0)
    ctrl = controller()
    teach(ctrl, 1, 0.02, 60, rng)
    for length in (30, 40, 50, 60, 70):
        teach(ctrl, length, 0.99, 40, rng)
    assert ctrl.next_gamma(1, 7) == 0
    assert ctrl.next_gamma(70, 7) >= 16  # a flat curve and α ≈ 0.99: draft far
    assert ctrl.alpha_at(1) < 0.1 < 0.9 < ctrl.alpha_at(70)


def test_plain_steps_teach_only_through_the_token_they_emitted():
    rng = np.random.default_rng(1)
    ctrl = controller()
    prior = ctrl.alpha_at(6)
    teach(ctrl, 6, 1.0, 30, rng)
    assert ctrl.alpha_at(6) > max(prior, 0.95)
    teach(ctrl, 6, 0.0, 60, rng)
    assert ctrl.alpha_at(6) < 0.2  # it forgets: content changes
    # No match, or no predicted token: nothing is learnt.
    before = ctrl.alpha_at(3)
    ctrl.next_gamma(0, None)
    ctrl.emitted(5)
    ctrl.next_gamma(3, None)
    ctrl.emitted(5)
    assert ctrl.alpha_at(3) == before


def test_drafted_rows_count_at_the_length_each_was_verified_at():
    ctrl = controller()
    before = {n: ctrl.alpha_at(n) for n in (2, 3, 4, 5)}
    split_before = ctrl.alpha_at(2, unanimous=False)
    ctrl.next_gamma(2, 7, unanimous=False)
    ctrl.observe(3, [1.0, 1.0, 0.0], 2, 1e-6, FLAT[3] / 1000)
    ctrl.emitted(7)  # consumed by the drafted rows: not counted twice
    assert ctrl.alpha_at(2, unanimous=False) > split_before  # row 0: a split match of length 2
    assert ctrl.alpha_at(2) == before[2]
    assert ctrl.alpha_at(3) > before[3]  # row 1: the copy picked its source, length 3
    assert ctrl.alpha_at(4) < before[4]  # row 2 was rejected
    assert ctrl.alpha_at(5) == before[5]


def test_disagreeing_occurrences_have_their_own_acceptance():
    rng = np.random.default_rng(2)
    ctrl = controller()
    teach(ctrl, 3, 0.95, 60, rng, unanimous=True)
    teach(ctrl, 3, 0.05, 60, rng, unanimous=False)
    assert ctrl.alpha_at(3) > 0.85 and ctrl.alpha_at(3, unanimous=False) < 0.15
    assert ctrl.next_gamma(3, 7, unanimous=False) == 0
    assert ctrl.next_gamma(3, 7, unanimous=True) > 0


def test_steep_costs_keep_even_long_matches_short():
    steep = [20.0 * (1 + 0.9 * (k - 1)) for k in range(1, 26)]  # a compute-bound target
    rng = np.random.default_rng(3)
    ctrl = MatchLengthController(CostModel(target_ms=steep, draft_ms=0.0), gamma_max=24)
    flat = controller()
    for c in (ctrl, flat):
        teach(c, 40, 0.97, 60, rng)
    assert 0 < ctrl.next_gamma(40, 7) < flat.next_gamma(40, 7)


def test_estimates_and_bad_settings():
    est = controller().estimates()
    assert est["cost"] == 0.0
    assert set(est["alpha_by_match_length"]) == set(est["alpha_by_match_length_split"])
    assert est["alpha_by_match_length"][">64"] > est["alpha_by_match_length"]["1"]
    for kw in ({"memory": 0.0}, {"memory": 1.5}, {"prior_weight": 0.0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            MatchLengthController(**kw)
