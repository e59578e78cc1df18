"""Outcomes just outside the support that batch noise can put inside it.

An engine computes its logits in other llama.cpp passes than the audit does
(γ + 1 rows, several sequences in one cache, another order of cache cells),
and the logits differ by rounding (docs/audit.md, "Batched logits versus
one-row logits").  Where the support's edge falls between two nearly equal
logits, or where the mass ahead of a token is within rounding of top-p, the
engine's row can hold a token that the audit's row leaves out (or the
reverse).  Such an outcome is evidence of rounding, not of a wrong sampler.

The criterion: every difference between two logits may move by at most
``tolerance``.  The shift most favourable to the outcome x lowers every
token ahead of it (more likely, or as likely with a lower id) by
tolerance / 2 and raises x and everything behind it by tolerance / 2: that
moves x as far forward in the order as the tolerance allows, minimises the
mass ahead of it (top-p) and maximises its ratio to the maximum (min-p).  x
is a near tie when it lies inside the support of that shifted row.  For a
greedy row this is the old test: x's logit within ``tolerance`` of the
argmax's.
"""

from __future__ import annotations

import numpy as np

from ..params import SamplingParams
from .chains import chain_distribution

__all__ = ["within_tolerance"]


def within_tolerance(logits: np.ndarray, outcome: int, params: SamplingParams, chain: str,
                     tolerance: float) -> bool:
    """Whether ``outcome`` is in the support of the row ``logits`` ``(V,)``
    once every logit difference may move by ``tolerance`` (see the module
    docstring).  False for an outcome whose logit is −∞."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    x = row[outcome]
    if not np.isfinite(x):
        return False
    ahead = (row > x) | ((row == x) & (np.arange(row.size) < outcome))
    half = tolerance / 2.0
    shifted = np.where(ahead, row - half, row + half)
    return bool(chain_distribution(shifted.astype(np.float32)[None, :], params, chain)[0, outcome] > 0)
