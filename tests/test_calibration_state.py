"""What ``calibrate`` leaves behind in the decoder it measures (tiny GGUF pair)."""

from __future__ import annotations

import pytest

from specdec_cpu import SamplingParams, SpeculativeDecoder
from specdec_cpu.planning.calibration import calibrate

pytest.importorskip("gguf")

UNSEEDED = SamplingParams(temperature=1.0)  # draws from the decoder's own streams


def _pair(tiny_target, tiny_draft):
    kw = dict(gamma=3, n_ctx=512, n_threads=1, seed=11, calibration=None)
    return (SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, **kw),
            SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, **kw))


def test_calibration_empties_the_caches_and_keeps_the_random_streams(tiny_target, tiny_draft):
    measured, twin = _pair(tiny_target, tiny_draft)
    for dec in (measured, twin):
        dec.generate("hello world", max_tokens=12, params=UNSEEDED)
    assert measured.target.n_past > 0

    model = calibrate(measured, params=SamplingParams(temperature=0.8), gamma_max=2, n_tokens=6,
                      repeats=1, cache=False)
    assert model.alpha is not None
    # The caches end empty, model and mirror alike, as after reset().
    assert measured.target.n_past == 0 and measured._target_lm.tokens(0) == []
    assert measured.draft.n_past == 0 and measured._draft_lm.tokens(0) == []

    # The decoder's own streams did not move: from the same (empty) cache
    # state, an unseeded request draws what its uncalibrated twin draws.
    twin.reset()
    after = measured.generate("the end", max_tokens=24, params=UNSEEDED).tokens
    assert after == twin.generate("the end", max_tokens=24, params=UNSEEDED).tokens


def test_a_stored_calibration_changes_nothing(tiny_target, tiny_draft):
    measured, _ = _pair(tiny_target, tiny_draft)
    first = calibrate(measured, gamma_max=2, n_tokens=4, repeats=1)  # measured (or found) and stored
    measured.generate("hello world", max_tokens=8, params=UNSEEDED)
    held = list(measured._target_lm.tokens(0))
    assert held and measured.target.n_past == len(held)
    again = calibrate(measured, gamma_max=2, n_tokens=4, repeats=1)  # answered by the store
    assert again.alpha == pytest.approx(first.alpha) and again.created == first.created
    assert measured._target_lm.tokens(0) == held and measured.target.n_past == len(held)
