"""Planning: how far to speculate, from theory, measured costs and live feedback.

- :mod:`.theory` — closed-form math: E[tokens](α, γ), speed-up, optimal γ;
- :mod:`.costmodel` — :class:`CostModel`, the measured pass times of a pair
  on one machine (T_target(k), T_draft(k), α), and its on-disk cache;
- :mod:`.calibration` — :func:`calibrate` measures a CostModel (a quick
  timing-only pass on first use, a full one from ``specdec-cpu calibrate``);
- :mod:`.policy` — :class:`DraftPolicy`, each step's route and γ for every
  decoding sequence (one sequence or a batch: the same policy): acceptance
  estimates, probes, exploring an unmeasured pair, draft catch-ups;
- :mod:`.batch_planner` — ``BatchPlanner``, the γ vector maximising the
  step's expected tokens per second, and its record of how steps did
  against their plans;
- :mod:`.match_alphas` — :class:`MatchAlphas`, the acceptance of
  prompt-lookup drafts per match length;
- :mod:`.pass_times` — ``PassTimes``, pass time per row count, learnt live;
- :mod:`.ledger` — ``DraftingLedger``, what drafting (catch-ups included)
  has gained over plain batching per batch size;
- :mod:`.forecast` — :func:`forecast`, the gain the batch planner expects
  over continuous batching at K requests from a calibration and an α.

Everything here is pure Python over numbers (calibration drives a decoder
through its protocols): no llama.cpp.
"""

from __future__ import annotations

from .calibration import SAMPLE_PROMPTS, calibrate, measure_alpha, time_passes
from .costmodel import (
    CostModel,
    ModelIdentity,
    cache_dir,
    calibration_key,
    calibration_path,
    cpu_model,
)
from .match_alphas import MatchAlphas
from .policy import DraftPolicy

__all__ = [
    "SAMPLE_PROMPTS",
    "CostModel",
    "DraftPolicy",
    "MatchAlphas",
    "ModelIdentity",
    "cache_dir",
    "calibrate",
    "calibration_key",
    "calibration_path",
    "cpu_model",
    "measure_alpha",
    "time_passes",
]
