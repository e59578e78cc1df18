"""End-of-generation ids as one outcome.

Engines do not emit an end-of-generation token as text: a generation that
stopped at one only tells us "some EOG token was drawn", not which (a model
may have several: EOS, end-of-turn, ...).  So the audit treats all EOG ids as
one outcome at every position, with the summed probability, represented by
the smallest EOG id.  Doing it everywhere (not only at the final position)
keeps ranks and entropies consistent across positions.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

__all__ = ["merge_eog"]


def merge_eog(probs: np.ndarray, outcomes: np.ndarray, eog_ids: Sequence[int],
              logits: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """Fold the EOG columns of ``probs`` ``(n, V)`` into the smallest EOG id.

    ``probs`` is modified in place and returned; an outcome that is any EOG
    id becomes the smallest one.  ``logits`` (copied) gets, in that column,
    the largest EOG logit (so a greedy mismatch's logit gap stays meaningful)
    and −inf in the other EOG columns.
    """
    ids = [i for i in eog_ids if 0 <= i < probs.shape[1]]
    if len(ids) == 0:
        return probs, outcomes, logits
    rep = min(ids)
    cols = np.asarray(ids)
    merged = probs[:, cols].sum(axis=1)
    probs[:, cols] = 0.0
    probs[:, rep] = merged
    outcomes = np.where(np.isin(outcomes, cols), rep, outcomes)
    if logits is not None:
        logits = np.array(logits, dtype=np.float32)
        top = logits[:, cols].max(axis=1)
        logits[:, cols] = -np.inf
        logits[:, rep] = top
    return probs, outcomes, logits
