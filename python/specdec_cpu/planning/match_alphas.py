"""Acceptance of prompt-lookup drafts, measured per match length.

How likely a copied continuation is to be accepted depends on how much of
the text is being copied: after the suffix has repeated 40 earlier tokens the
next copied token is almost surely right (code being edited, a document
quoted), after a single repeated token it is a coincidence.  One moving
average of α over both regimes would draft too little inside a copy and too
much outside one.  So this controller keeps α per match length L — the
probability that the next copied token is accepted when the suffix matches
the source for L tokens — and a draft's row j, verified only after rows
0..j−1 were accepted (the match then being L + j long), counts with α(L + j).
A match whose equally long occurrences were followed by different tokens is
a guess between them, and has its own α per length (on the bench prompts:
0.12 against 0.39 at L = 1); once its first token is accepted the copy has
picked its source, so its later rows count as unanimous ones.

Acceptance is learnt from every step that had a match, not only drafted ones:
a drafted row gives its exact α = p(x); a plain step (or a step another route
drafted) gives the indicator that the emitted token equals the one the match
predicted, whose mean is p(x) as well.  So the estimates keep up with the
content without probes.  The draft policy (policy.py) plans lookup drafts
with these estimates.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

__all__ = ["MatchAlphas"]

# Upper bounds of the match-length buckets (the last bucket is everything
# longer): one per length where α changes fastest, then wider.
_BUCKET_TOPS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)


_N_LENGTHS = len(_BUCKET_TOPS) + 1


def _bucket(length: int, unanimous: bool = True) -> int:
    """Index of the (match length, unanimous) bucket."""
    return bisect_left(_BUCKET_TOPS, max(int(length), 1)) + (0 if unanimous else _N_LENGTHS)


class MatchAlphas:
    """α per (match length, unanimous) bucket: the probability that the next
    copied token is accepted, learnt with exponential forgetting.

    Shared by every sequence of a decoder (the acceptance of copied text
    depends on the model and the kind of text, not on which request copies
    it).

    Args:
        memory: weight an observation keeps after each later one of its
            bucket (0.97: about the last 30 observations count).
        prior_weight: observations' worth of the prior in each bucket, so a
            bucket's first few observations already move it: α(L) = L / (L + 2),
            half that where the occurrences disagree.
    """

    def __init__(self, *, memory: float = 0.97, prior_weight: float = 2.0) -> None:
        if not 0.0 < memory <= 1.0:
            raise ValueError(f"memory must be in (0, 1], got {memory}")
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        self.memory, self.prior_weight = memory, prior_weight
        mids = np.array([1, 2, 3, 4, 5, 6, 7, 8, 10.5, 14.5, 20.5, 28.5, 40.5, 56.5, 96.0])
        self._prior = np.concatenate([mids / (mids + 2.0), 0.5 * mids / (mids + 2.0)])
        self._sum = np.zeros(2 * _N_LENGTHS)  # decayed Σ α per bucket
        self._n = np.zeros(2 * _N_LENGTHS)  # decayed count per bucket

    def alpha_at(self, match_length: int, unanimous: bool = True) -> float:
        """α̂: the estimated probability of accepting the next copied token."""
        b = _bucket(match_length, unanimous)
        w = self.prior_weight
        return float((self._sum[b] + w * self._prior[b]) / (self._n[b] + w))

    def row_alphas(self, length: int, unanimous: bool, n_rows: int) -> list[float]:
        """α̂ of rows 0..n_rows−1 of a draft copied from a match of ``length``:
        row j is verified after rows 0..j−1 were accepted, the match then
        being length + j long (and unanimous once its first token is in)."""
        return [self.alpha_at(length, unanimous)] + [self.alpha_at(length + j) for j in range(1, n_rows)]

    def record_rows(self, length: int, unanimous: bool, rows: list[float]) -> None:
        """Learn from the exact α of a drafted copy's verified rows."""
        for j, a in enumerate(rows):
            self._record(_bucket(length + j, unanimous or j > 0), min(max(a, 0.0), 1.0))

    def record_prediction(self, length: int, unanimous: bool, hit: bool) -> None:
        """Learn from a step that had a match but did not draft it: was the
        token the match predicted the one emitted?  (Its mean is p(x) too.)"""
        self._record(_bucket(length, unanimous), 1.0 if hit else 0.0)

    def _record(self, b: int, a: float) -> None:
        self._sum[b] = self.memory * self._sum[b] + a
        self._n[b] = self.memory * self._n[b] + 1.0
