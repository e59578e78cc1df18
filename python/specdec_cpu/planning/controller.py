"""Online choice of the draft length γ from measured acceptance and step costs.

Each step the decoder asks :meth:`GammaController.next_gamma`, runs the step,
and reports what happened with :meth:`GammaController.observe`.  The
controller keeps running estimates of

- α̂: an exponential moving average of the exact per-row acceptance Σ min(p, q),
- T̂(k): the target's time for a pass over k rows (EMA per k),
- d̂: the draft's time per drafted token,

and picks the γ maximising E[tokens](α̂, γ) / (γ·ĉ + v̂(γ+1)) with
ĉ = d̂ / T̂(1) and v̂(k) = T̂(k) / T̂(1).  γ = 0 (plain decoding) is chosen when
nothing is predicted to beat plain decoding by ``min_speedup``; from then on a
short probe every ``probe_every`` plain steps re-measures α̂, because
acceptance changes with the content being generated.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Optional, Sequence

import numpy as np

from . import theory
from .batch_planner import row_weight
from .costmodel import CostModel
from .pass_times import PassTimes

__all__ = ["GammaController"]


class GammaController:
    """Chooses γ per step; see the module docstring for the model.

    Args:
        cost_model: a calibration (timings, and α if measured).  Without one
            the controller starts from priors: c = ``cost_prior`` and the
            cautious verify-cost curve v(k) = 1 + ``slope_prior``·(k − 1)
            (0.3 per row sits between the memory-bound and compute-bound
            curves measured on small CPUs, docs/math.md §8), and it spends its
            first ``warmup`` steps on plain decoding to measure T(1).
        gamma_max: largest γ ever returned.
        alpha_prior: α̂ before any row is observed (unless the cost model has α).
            While α̂ is this guess and plain decoding is chosen, the first
            step after the warm-up is a probe: the guess is never relied on.
        ema: weight of one row's α in the moving average.
        prior_rows: how many observed rows the starting α̂ counts as (default:
            20 for an α the cost model measured, 1 for ``alpha_prior``): the
            n-th row weighs 1 / (prior_rows + n) until that falls to ``ema``,
            so the first rows replace a guess by their running mean instead
            of moving it by ``ema`` per row.
        time_ema: weight of one step's timing in the T̂(k) and d̂ averages.
        probe_every: plain steps between probes while γ = 0 is chosen.  After
            a probe whose own rows say speculation would pay, the next probe
            comes at once (so α̂ catches up with new content in a few steps);
            after one that says it would not, the interval doubles, up to
            ``probe_max``.
        probe_gamma: γ of a probe step.
        min_speedup: predicted speed-up a γ > 0 must reach to be chosen; the
            margin keeps estimation noise from choosing speculation that is
            really slower than plain decoding.
        stale_cap: largest weight the first α row after a plain stretch gets
            (α̂ is stale after many plain tokens, so that row counts for more).
        stale_steps: steps after which an unobserved T̂(k) follows the drift
            of the pass times that are being observed.
        refresh_every: while speculating, one plain step this often
            re-measures T̂(1) (≈ 1% of the steps at the default).
        history_len: steps of γ history kept for statistics.
    """

    def __init__(
        self,
        cost_model: Optional[CostModel] = None,
        *,
        gamma_max: int = 12,
        alpha_prior: float = 0.7,
        ema: float = 0.1,
        prior_rows: Optional[float] = None,
        time_ema: float = 0.2,
        probe_every: int = 32,
        probe_max: int = 256,
        probe_gamma: int = 2,
        min_speedup: float = 1.02,
        cost_prior: float = 0.2,
        slope_prior: float = 0.3,
        warmup: int = 2,
        stale_cap: float = 0.5,
        stale_steps: int = 8,
        refresh_every: int = 128,
        history_len: int = 10_000,
    ) -> None:
        if isinstance(gamma_max, bool) or not isinstance(gamma_max, int) or gamma_max < 0:
            raise ValueError(f"gamma_max must be an int >= 0, got {gamma_max!r}")
        for name, w in (("ema", ema), ("time_ema", time_ema), ("stale_cap", stale_cap)):
            if not 0.0 < w <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {w}")
        if not 0.0 <= alpha_prior <= 1.0:
            raise ValueError(f"alpha_prior must be in [0, 1], got {alpha_prior}")
        if prior_rows is not None and not prior_rows >= 0:
            raise ValueError(f"prior_rows must be >= 0, got {prior_rows}")
        if probe_every < 1 or probe_max < probe_every:
            raise ValueError(f"need 1 <= probe_every <= probe_max, got {probe_every}, {probe_max}")
        if probe_gamma < 1:
            raise ValueError(f"probe_gamma must be >= 1, got {probe_gamma}")
        if cost_prior < 0 or slope_prior < 0 or min_speedup <= 0:
            raise ValueError("cost_prior and slope_prior must be >= 0, min_speedup > 0")
        self.gamma_max = gamma_max
        self.ema, self.time_ema, self.stale_cap = ema, time_ema, stale_cap
        self.probe_every, self.probe_max = probe_every, probe_max
        self.probe_gamma = min(probe_gamma, gamma_max)
        self.min_speedup = min_speedup
        self.cost_prior, self.slope_prior = cost_prior, slope_prior

        k_top = gamma_max + 1
        seed = None if cost_model is None else [cost_model.target_time(k) for k in range(1, k_top + 1)]
        self._times = PassTimes(k_top, seed, prior_slope=slope_prior, ema=time_ema, stale_after=stale_steps)
        self.stale_steps = stale_steps
        self.refresh_every = refresh_every
        self._refresh_interval = min(16, refresh_every)
        self._d: Optional[float] = None  # d̂, ms per drafted token
        self.alpha = alpha_prior
        self._warmup = warmup
        self._alpha_measured = cost_model is not None and cost_model.alpha is not None
        if cost_model is not None:
            self._d = cost_model.draft_ms
            if cost_model.alpha is not None:
                self.alpha = cost_model.alpha
            self._warmup = 0  # T(1) is known from the calibration
        self.alpha_first = self.alpha_rest = self.alpha  # see _observe_alpha
        self.prior_rows = (20.0 if self._alpha_measured else 1.0) if prior_rows is None else float(prior_rows)
        self._rows_seen = [0, 0, 0]  # rows observed: all, first rows, later rows

        self._stale = 0  # plain steps since the last α observation
        self._skip_draft_time = True  # the first draft of a sequence includes its prefill
        self._plain_run = 0
        self._probe_interval = probe_every
        self._probing = False
        self.history: deque[int] = deque(maxlen=history_len)
        self.gamma_counts: dict[int, int] = {}
        self.steps = 0
        self._best = self._choose()

    # ------------------------------------------------------------ per step
    def next_gamma(self) -> int:
        """The draft length for the next step (0 = plain decoding)."""
        if self.gamma_max == 0 or self._warmup > 0:
            return 0
        if self._best > 0:
            self._plain_run = 0
            return 0 if self._refresh_due() else self._best
        self._plain_run += 1
        if self._plain_run > self._probe_interval or self._alpha_is_guess():
            self._plain_run = 0
            if self._could_pay():
                self._probing = True
                return self.probe_gamma
        return 0

    def observe(self, gamma: int, alphas: Sequence[float], n_accepted: int,
                draft_seconds: Optional[float], target_seconds: Optional[float]) -> None:
        """Report one finished step.

        Args:
            gamma: the draft length actually used (0 for a plain step).
            alphas: the exact Σ min(p, q) of each verified row (may be empty).
            n_accepted: draft tokens accepted (used for α only when ``alphas``
                is empty: each accept/reject decision is a Bernoulli(α) draw).
            draft_seconds: time spent drafting this step's γ tokens.
            target_seconds: time of this step's target pass over γ + 1 rows.
        """
        gamma = int(gamma)
        self.steps += 1
        self.history.append(gamma)
        self.gamma_counts[gamma] = self.gamma_counts.get(gamma, 0) + 1

        rows = [float(a) for a in alphas if math.isfinite(a)]
        if not rows and gamma > 0:
            n_acc = max(0, min(int(n_accepted), gamma))
            rows = [1.0] * n_acc + ([0.0] if n_acc < gamma else [])
        self._observe_alpha(rows)
        if gamma == 0:
            self._stale += 1
            if self._warmup > 0:
                self._warmup -= 1

        if gamma > 0 and _positive(draft_seconds):
            if self._skip_draft_time:
                # The draft caught up on tokens it skipped (a prompt or plain
                # steps): that time says nothing about the cost per draft token.
                self._skip_draft_time = False
            else:
                self._d = self._blend(self._d, 1000.0 * draft_seconds / gamma)
        if gamma == 0:
            self._skip_draft_time = True
        self._times.observe(gamma + 1, 1000.0 * target_seconds if _positive(target_seconds) else math.nan)

        if self._needs_recheck(gamma):
            self._best = self._choose()
        if self._probing and gamma > 0:
            self._probing = False
            self._after_probe(rows)
        elif self._probing:
            self._plain_run = self._probe_interval  # the probe was cut to γ = 0: retry next step

    def emitted(self, first_token: int) -> None:
        """The first token the last step emitted, for a controller that had
        predicted it (see ``MatchLengthController``); this one has not."""

    def new_sequence(self) -> None:
        """Tell the controller a new generation starts.

        Its content may differ from the last one's, so a probe back-off
        earned on the last one starts over (the first probe comes after
        ``probe_every`` plain steps, not after up to ``probe_max``); and its
        first draft includes the draft model's prompt processing.
        """
        self._probe_interval = self.probe_every
        self.draft_fell_behind()

    def draft_fell_behind(self) -> None:
        """The drafter has tokens to catch up on (a new prompt, or steps of
        another route): its next draft time is not the cost of drafting."""
        self._skip_draft_time = True

    # ------------------------------------------------------------ estimates
    @property
    def cost(self) -> float:
        """ĉ = d̂ / T̂(1) (the prior until both are measured)."""
        return self._cost(self._curve())

    def verify_curve(self) -> np.ndarray:
        """v̂ indexed by k = 0..gamma_max+1 (v̂[0] = nan, v̂[1] = 1)."""
        t = self._curve()
        v = t / t[1]
        v[0] = np.nan
        return v

    def predicted_speedup(self, gamma: int) -> float:
        """Speed-up the current estimates predict for draft length ``gamma``."""
        return float(theory.speedup(self.alpha, gamma, self.cost, self.verify_curve()))

    def estimates(self) -> dict:
        """α̂, ĉ and v̂(k) as plain data, for statistics and logs."""
        return {
            "alpha": self.alpha,
            "cost": self.cost,
            "verify_cost": [float(x) for x in self.verify_curve()[1:]],
            "target_ms": None if not self._measured() else [float(x) for x in self._curve()[1:]],
            "best_gamma": self._best,
        }

    def gamma_runs(self) -> list[tuple[int, int]]:
        """Recent γ history as (γ, consecutive steps) runs."""
        runs: list[tuple[int, int]] = []
        for g in self.history:
            if runs and runs[-1][0] == g:
                runs[-1] = (g, runs[-1][1] + 1)
            else:
                runs.append((g, 1))
        return runs

    # ------------------------------------------------------------ internals
    def _alpha_is_guess(self) -> bool:
        """Whether α̂ is still ``alpha_prior``: no cost model measured it and
        no row has been verified (such a controller probes at once)."""
        return not self._alpha_measured and self._rows_seen[0] == 0

    def _observe_alpha(self, rows: list[float]) -> None:
        if not rows:
            return
        # After s plain steps the estimate is s tokens old: the first new row
        # gets the weight s+1 rows would have had (capped), so a probe can
        # reveal a change of content quickly.
        stale = 0.0
        if self._stale:
            stale = min(self.stale_cap, 1.0 - (1.0 - self.ema) ** (1 + self._stale))
        seen = self._rows_seen
        for i, a in enumerate(rows):
            a = min(max(a, 0.0), 1.0)
            self.alpha += max(stale, self._weight(seen[0])) * (a - self.alpha)
            # Row 0 is verified every step; a later row only after the rows
            # before it were accepted.  Tracking the two apart captures
            # correlated acceptance (an n-gram continuation that matches its
            # first token usually matches the next ones too), which the
            # i.i.d. formula E = (1 - α^(γ+1)) / (1 - α) cannot express.
            kind = 1 if i == 0 else 2
            w = max(stale, self._weight(seen[kind]))
            if i == 0:
                self.alpha_first += w * (a - self.alpha_first)
            else:
                self.alpha_rest += w * (a - self.alpha_rest)
            seen[0] += 1
            seen[kind] += 1
            stale = 0.0
        self._stale = 0

    def _weight(self, seen: int) -> float:
        return row_weight(self.ema, self.prior_rows, seen)

    def _after_probe(self, rows: list[float]) -> None:
        if self._best > 0:  # speculation is back on
            self._probe_interval = self.probe_every
        elif rows and self._choose(sum(rows) / len(rows)) > 0:
            # The probe's own rows say speculation would pay but α̂ has not
            # caught up yet: probe again at once rather than wait.
            self._probe_interval = self.probe_every
            self._plain_run = self._probe_interval
        else:  # nothing changed: back off, so a stable plain stretch stays cheap
            self._probe_interval = min(2 * self._probe_interval, self.probe_max)

    def _needs_recheck(self, gamma: int) -> bool:
        """Whether :meth:`observe` re-chooses γ after a step of length ``gamma``.

        A drafted step changes α̂ and T̂(k > 1): re-choose at once.  A plain
        step only moves T̂(1) (and the stale T̂(k) alike), so while plain
        decoding is chosen every 16th step is enough; this keeps the
        controller's cost per plain step to a few microseconds, which matters
        where γ = 0 is the answer and the target pass is short.
        """
        return gamma > 0 or self._best > 0 or self.steps % 16 == 0

    def _blend(self, old: Optional[float], new: float) -> float:
        """Moving average of d̂; one wild reading moves it by at most ~3× the weight."""
        if old is None or not math.isfinite(old):
            return new
        return old + self.time_ema * (min(new, 3.0 * old) - old)

    def _cost(self, t: np.ndarray) -> float:
        if self._d is None or not self._measured():
            return self.cost_prior
        return float(self._d / t[1])

    def _measured(self) -> bool:
        return self._times.measured

    def _curve(self) -> np.ndarray:
        """T̂(k) for k = 0..gamma_max+1 (ms, or prior units before any timing)."""
        return self._times.curve()

    def _could_pay(self) -> bool:
        """Whether any α at all would make speculation pay at the current costs.

        A probe is not free (the draft first catches up on every token it
        skipped), so where even perfect acceptance cannot beat plain decoding
        (a compute-bound target with a costly draft) probing is pure loss.
        """
        return self._choose(alpha=1.0) > 0

    def _choose(self, alpha: Optional[float] = None) -> int:
        """The best γ at the current estimates (or at a uniform ``alpha``)."""
        first, rest = (self.alpha_first, self.alpha_rest) if alpha is None else (alpha, alpha)
        return self._best_gamma([first] + [rest] * (self.gamma_max - 1))

    def _best_gamma(self, row_alpha: Sequence[float]) -> int:
        """The γ maximising E[tokens] / (γ·ĉ + v̂(γ+1)) when row j of a draft
        (j = 0..gamma_max−1) is accepted with probability ``row_alpha[j]``
        given that the rows before it were: E[tokens] = 1 + α₀ + α₀α₁ + ...
        (with every α equal, the seed's (1 − α^(γ+1)) / (1 − α)).  0 unless
        the best beats plain decoding by ``min_speedup``."""
        if self.gamma_max == 0:
            return 0
        t = self._curve()
        c = self._cost(t)
        v = (t / t[1]).tolist()
        # A plain loop, not theory.speedup: this runs every step, and numpy's
        # per-call overhead on a dozen numbers would cost more than the arithmetic.
        best, best_s = 0, 1.0
        e, reach = 1.0, 1.0
        for g in range(1, self.gamma_max + 1):
            reach *= row_alpha[g - 1]
            e += reach
            s = e / (g * c + v[g + 1])
            if s > best_s:
                best, best_s = g, s
        return best if best_s >= self.min_speedup else 0

    def _refresh_due(self) -> bool:
        """Whether a speculating controller should take a plain step to
        re-measure T̂(1) (16, 32, ... up to ``refresh_every`` steps apart).

        Only the choice between γ = 0 and γ > 0 depends on T̂(1), and while
        speculating nothing else re-measures it."""
        if self.steps - self._times.last_seen(1) > self._refresh_interval:
            self._refresh_interval = min(2 * self._refresh_interval, self.refresh_every)
            return True
        return False


def _positive(x: Optional[float]) -> bool:
    return x is not None and math.isfinite(x) and x > 0
