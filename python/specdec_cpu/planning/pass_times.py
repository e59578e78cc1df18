"""A model's pass time as a function of the rows in the pass, learnt online.

Both planners need T(k), the time of one llama.cpp pass over k rows: the
single-request controller for the target's verify curve v(k) = T(k) / T(1),
the batch planner for the target over all requests' rows and for the draft
over the requests drafting at one depth.  :class:`PassTimes` keeps one
moving average per row count, seeded by a calibration when there is one,
and answers for any k by interpolating between the counts it has seen.

Three things make the estimates track a shared, noisy machine:

- a count's first reading may be cold (weights not yet in the page cache,
  a first call's one-off setup: a 0.5B draft's first pass has taken 977 ms
  against 22 ms after), so until a count has :data:`SETTLE` readings its
  estimate is the lowest of them, not a moving average that a cold first
  reading would hold up for dozens of passes;

- one wild reading (a page fault, another process) moves an estimate by at
  most a bounded step;
- a change of machine load moves every pass time together: when a count is
  observed, the counts *not* observed lately (or never: only seeded) are
  scaled by the same factor (``follow drift``), so T(1) measured in a busy
  minute does not stay inflated while only k > 1 passes run, and a
  calibration taken on a quiet machine with a short cache is corrected at
  every count as soon as one is observed.

The batch planner narrows both (``drift_band``, ``max_jump``).  Its passes
range from a few rows to hundreds (prompt chunks, catch-ups), and a count's
change is then mostly its own (how full the caches were, the prompt's
length), not the machine's: traced at four requests, the 4-row time the
planner compared drafting with had been carried 10% above the 4-row passes
that ran, by changes of 12- to 106-row passes while only those ran, and by
single slow readings (one pass of 2.3× the others moved it by 26%).  That
made drafting look 10% better than it was.  So there a measured count
follows only counts within a factor ``drift_band`` of its own, and one
reading moves an estimate by at most ``ema × (max_jump − 1)`` (the first
after a long gap, which weighs more, by at most ``0.6 × (max_jump − 1)``).

With a band, a count only seeded by the calibration is its seed times the
median drift of the measured counts from their seeds, rather than following
each change of each count: those changes compound (every count's drift
from its seed multiplies in).  Traced at eight requests after ~10 blocks of
`bench.serving`, the seeded 16- to 23-row target times had been multiplied
down to 76 ms against 178 ms measured when they ran.  Stale measured counts
within the band compound the same way, so the batch planner uses a band
of 1: a measured count follows no other (batch_planner.py).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

__all__ = ["PassTimes", "SETTLE"]

#: Readings of a count whose minimum is its estimate before the moving
#: average takes over (the first is often cold; two warm readings agree).
SETTLE = 2


class PassTimes:
    """T(k) in milliseconds for k = 1..``k_max``, learnt from observed passes.

    Args:
        k_max: the largest row count tracked; larger k are extrapolated.
        seed_ms: T(k) for k = 1..len(seed_ms) from a calibration (or None).
        prior_slope: before anything is measured, T(k) ∝ 1 + prior_slope·(k − 1)
            (a cautious slope between memory-bound and compute-bound curves);
            with one measured point the prior shape is scaled through it.
        ema: weight of one observation in a count's moving average.
        stale_after: observations of other counts after which a count is
            "not observed lately" (its next reading weighs more, and it
            follows the drift of the others).
        drift_band: a count once measured follows the drift of counts
            within this factor of it only (None: of every count); counts
            only seeded follow every count.
        max_jump: one reading counts as at most this many times the
            estimate and at least its inverse (None: at most 3 times, and
            any lower reading in full).
    """

    def __init__(self, k_max: int, seed_ms: Optional[Sequence[float]] = None, *,
                 prior_slope: float = 0.3, ema: float = 0.2, stale_after: int = 8,
                 drift_band: Optional[float] = None, max_jump: Optional[float] = None) -> None:
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
            raise ValueError(f"k_max must be an int >= 1, got {k_max!r}")
        if not 0.0 < ema <= 1.0:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        if prior_slope < 0:
            raise ValueError(f"prior_slope must be >= 0, got {prior_slope}")
        if drift_band is not None and drift_band < 1.0:
            raise ValueError(f"drift_band must be >= 1 or None, got {drift_band}")
        if max_jump is not None and max_jump <= 1.0:
            raise ValueError(f"max_jump must be > 1, got {max_jump}")
        self.k_max, self.ema, self.prior_slope, self.stale_after = k_max, ema, prior_slope, stale_after
        self.drift_band, self.max_jump = drift_band, max_jump
        self._t = np.full(k_max + 1, np.nan)  # index k (0 unused)
        self._seen = np.zeros(k_max + 1, dtype=np.int64)  # observation number of each count's last reading
        self._readings = np.zeros(k_max + 1, dtype=np.int64)  # readings of each count
        self.observations = 0
        self._seed = np.full(k_max + 1, np.nan)
        if seed_ms is not None:
            seed = [float(x) for x in seed_ms][:k_max]
            self._t[1:len(seed) + 1] = seed
            self._seed[1:len(seed) + 1] = seed
        self._measured = bool(np.any(np.isfinite(self._t[1:])))
        # The curve is read several times per step (every plan, probe and
        # catch-up judgement) and changes only with an observation: computed
        # once per change, it costs a batch planner's step a fraction of a
        # millisecond instead of one or two.
        self._curve: Optional[np.ndarray] = None
        self._curve_list: Optional[list[float]] = None

    @property
    def measured(self) -> bool:
        """Whether any count has a time (measured or seeded)."""
        return self._measured

    def known(self, k: int) -> bool:
        """Whether count ``k`` has a time of its own (observed or seeded), not
        one read off the prior or its neighbours."""
        return bool(self._seen[k] > 0 or math.isfinite(self._seed[k])) if 1 <= k <= self.k_max else False

    def settled(self, k: int) -> bool:
        """Whether count ``k``'s time is trustworthy: seeded by a calibration,
        or read at least :data:`SETTLE` times (the first may be cold)."""
        if not 1 <= k <= self.k_max:
            return False
        return bool(self._readings[k] >= SETTLE or math.isfinite(self._seed[k]))

    def last_seen(self, k: int) -> int:
        """Observation number of the last reading of count ``k`` (0: never)."""
        return int(self._seen[k])

    def observe(self, k: int, ms: float) -> None:
        """Record one pass over ``k`` rows that took ``ms`` milliseconds."""
        self.observations += 1
        if not (math.isfinite(ms) and ms > 0) or k < 1:
            return
        if k > self.k_max:
            return  # beyond the tracked range: extrapolated, not stored
        self._curve = self._curve_list = None
        self._measured = True
        if self.drift_band is not None and self._seen[k] == 0 and math.isfinite(self._seed[k]):
            self._t[k] = self._seed[k] * self._seeded_drift()  # its estimate until now
        before = self._t[k]
        settling = 0 < self._readings[k] < SETTLE and not math.isfinite(self._seed[k])
        if settling:
            self._t[k] = min(before, ms)  # a cold first reading gives way to a lower one in full
        else:
            stale = self.observations - self._seen[k] > self.stale_after
            self._t[k] = self._blend(before, ms, max(self.ema, 0.6) if stale else self.ema)
        self._seen[k] = self.observations
        self._readings[k] += 1
        if math.isfinite(before) and not settling:  # a cold reading says nothing of the machine's load
            self._follow_drift(k, self._t[k] / before)

    def curve(self) -> np.ndarray:
        """T(k) for k = 0..k_max (index 0 unused; prior units before any time),
        read-only: the same array until the next observation.

        Unmeasured counts are interpolated between measured ones and
        continued linearly beyond them (least-squares slope, never negative).
        """
        if self._curve is None:
            self._curve = self._compute_curve()
            self._curve.flags.writeable = False
        return self._curve

    def curve_list(self) -> list[float]:
        """:meth:`curve` as a list (for per-element reads in Python loops);
        shared until the next observation, so not to be modified."""
        if self._curve_list is None:
            self._curve_list = self.curve().tolist()
        return self._curve_list

    def _compute_curve(self) -> np.ndarray:
        k = np.arange(self.k_max + 1, dtype=float)
        prior = 1.0 + self.prior_slope * (k - 1.0)
        times = self._t
        if self.drift_band is not None:
            only_seeded = (self._seen == 0) & np.isfinite(self._seed)
            if only_seeded.any():
                times = times.copy()
                times[only_seeded] = self._seed[only_seeded] * self._seeded_drift()
        known = np.isfinite(times)
        known[0] = False
        if not known.any():
            return prior
        kk, tt = k[known], times[known]
        if kk.size == 1:
            return tt[0] * prior / prior[int(kk[0])]
        t = np.interp(k, kk, tt)
        dk = kk - kk.mean()
        slope = max(float(dk @ (tt - tt.mean()) / (dk @ dk)), 0.0)
        right = k > kk[-1]
        t[right] = tt[-1] + slope * (k[right] - kk[-1])
        left = k < kk[0]
        t[left] = np.maximum(tt[0] - slope * (kk[0] - k[left]), 0.05 * tt[0])
        return t

    def time(self, k: int) -> float:
        """T(k) for any k >= 1 (linear beyond ``k_max``)."""
        c = self.curve()
        if k <= self.k_max:
            return float(c[k])
        slope = max(float(c[-1] - c[-2]), 0.0) if self.k_max >= 2 else 0.0
        return float(c[-1] + slope * (k - self.k_max))

    # ------------------------------------------------------------ internals
    def _seeded_drift(self) -> float:
        """How far the measured counts that had a seed are from it (the
        median ratio; 1 before any of them is measured)."""
        measured = (self._seen > 0) & np.isfinite(self._seed)
        if not measured.any():
            return 1.0
        return float(np.median(self._t[measured] / self._seed[measured]))

    def _blend(self, old: float, new: float, weight: float) -> float:
        if not math.isfinite(old):
            return new
        # A single wild reading moves the estimate by a bounded step.
        jump = self.max_jump
        new = min(new, 3.0 * old) if jump is None else min(max(new, old / jump), jump * old)
        return old + weight * (new - old)

    def _follow_drift(self, k: int, factor: float) -> None:
        """Scale the counts not observed lately by the change just seen at k.

        A plain loop over the entries: it runs every step, and numpy's masked
        updates cost more than the rest of a controller's step for a dozen
        entries.
        """
        band = self.drift_band
        if band is not None and band <= 1.0:
            return  # a band of 1: a count follows only itself, and seeded counts the median drift
        horizon = self.observations - self.stale_after
        t, seen = self._t, self._seen
        lo, hi = (k / band, k * band) if band is not None else (0.0, math.inf)
        for j in range(1, t.shape[0]):
            # Counts only seeded (never observed) follow from the first observation:
            # a calibration's curve is off by the same load (or the same cache size)
            # at the counts a plan compares with those it is running at.
            # With a band, a count only seeded is its seed times the measured counts'
            # median drift instead (_compute_curve): following each change compounds them.
            if seen[j] == 0 and band is not None:
                continue
            if j != k and (seen[j] == 0 or (seen[j] < horizon and lo <= j <= hi)) and math.isfinite(t[j]):
                t[j] *= factor
