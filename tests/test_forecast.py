"""specdec_cpu.planning.forecast: the batch planner's expected gain per K."""

from __future__ import annotations

import pytest

from specdec_cpu.planning.costmodel import CostModel
from specdec_cpu.planning.forecast import forecast


def _model(alpha: float = 0.9) -> CostModel:
    # A memory-bound target (extra rows nearly free) and a draft whose pass grows with its batch.
    return CostModel(target_ms=[100.0 + 2.0 * k for k in range(64)], draft_ms=20.0,
                     draft_batch_ms=[20.0 * b for b in range(1, 33)], alpha=alpha)


def test_one_request_is_the_single_request_rule():
    """With one request the batch planner's forecast is the closed-form optimum
    E / (γ·c + v(γ + 1)) over γ: the same γ and the same speed-up."""
    m = _model()
    for alpha in (0.6, 0.8, 0.95):
        (f,) = forecast(m, alpha, [1], gamma_max=10)
        g = m.optimal_gamma(10, alpha)
        assert f.users == 1 and f.gammas == (g,) and g >= 1
        assert f.gain == pytest.approx(m.speedup(g, alpha), rel=1e-9)
        assert f.plain_tps == pytest.approx(1000.0 / m.target_time(1))


def test_the_gain_falls_to_continuous_batching_as_requests_share_the_pass():
    fs = forecast(_model(), 0.9, [1, 2, 4, 16], gamma_max=8)
    gains = [f.gain for f in fs]
    assert gains == sorted(gains, reverse=True) and gains[0] > 1.5
    assert fs[-1].gammas == (0,) * 16 and fs[-1].gain == pytest.approx(1.0)
    assert fs[2].plain_tps > fs[0].plain_tps  # batching alone gains from the shared pass


@pytest.mark.parametrize("kwargs,needle", [
    (dict(alpha=1.5), "alpha must be in [0, 1]"),
    (dict(users=[]), "users must be"),
    (dict(users=[0, 2]), "users must be"),
    (dict(gamma_max=0), "gamma_max must be"),
])
def test_arguments_out_of_range_are_named(kwargs, needle):
    args = dict(model=_model(), alpha=0.9, users=[1], gamma_max=8) | kwargs
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        forecast(**args)


def test_a_calibration_without_the_drafts_batch_curve_is_refused():
    with pytest.raises(ValueError, match="draft_batch_ms"):
        forecast(CostModel(target_ms=[10.0, 12.0], draft_ms=1.0, alpha=0.9), 0.9, [2])
