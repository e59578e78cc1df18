"""Planning: how far to speculate, from theory, measured costs and live feedback.

- :mod:`.theory` — closed-form math: E[tokens](α, γ), speed-up, optimal γ;
- :mod:`.costmodel` — :class:`CostModel`, the measured pass times of a pair
  on one machine (T_target(k), T_draft(k), α), and its on-disk cache;
- :mod:`.calibration` — :func:`calibrate` measures a CostModel (a quick
  timing-only pass on first use, a full one from ``specdec-cpu calibrate``);
- :mod:`.controller` — :class:`GammaController` picks one request's γ per step;
- :mod:`.match_controller` — :class:`MatchLengthController`, the same for
  prompt-lookup drafts, with α learnt per match length;
- :mod:`.batch_planner` — ``BatchPlanner``, every request's γ in a batched
  step, and its record of how steps did against their plans;
- :mod:`.pass_times` — ``PassTimes``, pass time per row count, learnt live;
- :mod:`.ledger` — ``DraftingLedger``, what drafting (catch-ups included)
  has gained over plain batching per batch size;
- :mod:`.forecast` — :func:`forecast`, the gain the batch planner expects
  over continuous batching at K requests from a calibration and an α.

Everything here is pure Python over numbers: no model, no llama.cpp.
"""

from __future__ import annotations

from .calibration import SAMPLE_PROMPTS, calibrate, measure_alpha, time_passes
from .controller import GammaController
from .costmodel import (
    CostModel,
    ModelIdentity,
    cache_dir,
    calibration_key,
    calibration_path,
    cpu_model,
)
from .match_controller import MatchLengthController

__all__ = [
    "SAMPLE_PROMPTS",
    "CostModel",
    "GammaController",
    "MatchLengthController",
    "ModelIdentity",
    "cache_dir",
    "calibrate",
    "calibration_key",
    "calibration_path",
    "cpu_model",
    "measure_alpha",
    "time_passes",
]
