"""The planner: measured cost model, calibration and the online γ controller.

One import point for the pieces that decide how far to speculate:

- :class:`~specdec_cpu.costmodel.CostModel` — measured T_target(k), T_draft(1), α;
- :func:`~specdec_cpu.calibration.calibrate` — measures (and caches) a CostModel;
- :class:`~specdec_cpu.controller.GammaController` — picks γ per step online;
- :class:`~specdec_cpu.match_controller.MatchLengthController` — the same for
  prompt-lookup drafts, with α learnt per match length.

The closed-form math lives in :mod:`specdec_cpu.theory`.
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
