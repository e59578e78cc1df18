"""γ for every request of a batch: the draft lengths that maximise the batch's
expected emitted tokens per second (docs/serving.md §2).

With requests i = 1..B in one step, request i drafting γᵢ tokens, the step costs

    T_step = T_target(R₀ + Σᵢ (γᵢ + 1)) + Σ_d T_draft(B_d)

(R₀: prompt rows processed in the same pass; B_d: rows of the draft model's
pass at depth d, i.e. the requests still drafting at that depth, plus the
tokens a request's draft cache catches up on at depth 0) and emits
Σᵢ E[tokens]ᵢ(γᵢ) tokens in expectation, E = 1 + α₀ + α₀α₁ + ... from each
request's own row acceptances.  :meth:`BatchPlanner.plan` maximises the
ratio by coordinate ascent: each request in turn takes the (route, γ) that
is best given the others, until nothing changes.  With one request that is
an exhaustive search over γ, i.e. the single-request rule
E / (γ·c + v(γ + 1)); with many, the rows stop being free and the γᵢ fall
towards 0 (continuous batching alone) by themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .costmodel import CostModel
from .pass_times import PassTimes

__all__ = ["BatchPlanner", "DraftOption", "PlanRequest", "AlphaTracker"]

_MAX_DEPTH = 64  # the longest draft any route may propose (decoder.GAMMA_LIMIT)


@dataclass(frozen=True)
class DraftOption:
    """One way a request could draft this step.

    Attributes:
        route: the drafter's name (``"model"``, ``"ngram"``).
        row_alphas: α̂ of draft rows 0, 1, ... (row j counts only after rows
            0..j−1 were accepted); its length bounds γ.
        costly: drafting runs the draft model (one pass per depth); a lookup
            costs nothing.
        catch_up: rows the draft model must take in at depth 0 before its
            first draft token (the tokens its cache lacks, at least 1).
    """

    route: str
    row_alphas: Sequence[float]
    costly: bool = True
    catch_up: int = 1


@dataclass
class PlanRequest:
    """A request to plan for: the ways it could draft.

    ``fixed`` is the γ of a request that asked for one (``gamma=N``): it then
    drafts ``min(fixed, len(row_alphas))`` tokens through its first option,
    and only the other requests are planned around it.
    """

    options: Sequence[DraftOption] = ()
    fixed: Optional[int] = None


@dataclass
class AlphaTracker:
    """Moving averages of one drafter's acceptance: of a draft's first row,
    and of later rows given the earlier ones were accepted (drafts of
    predictable text are accepted in runs, which one α cannot express)."""

    first: float = 0.7
    rest: float = 0.7
    ema: float = 0.1
    stale: int = field(default=0, repr=False)  # plain steps since the last observation

    def observe(self, rows: Sequence[float]) -> None:
        """Learn from the exact Σ min(p, q) of one step's verified rows."""
        w = self.ema
        if self.stale:  # an old estimate: the first new row counts for more
            w = max(self.ema, min(0.5, 1.0 - (1.0 - self.ema) ** (1 + self.stale)))
        for j, a in enumerate(rows):
            a = min(max(float(a), 0.0), 1.0)
            if j == 0:
                self.first += w * (a - self.first)
            else:
                self.rest += w * (a - self.rest)
            w = self.ema
        if rows:
            self.stale = 0

    def row_alphas(self, n: int) -> list[float]:
        """α̂ of rows 0..n−1."""
        return [self.first] + [self.rest] * (n - 1) if n > 0 else []


class BatchPlanner:
    """Chooses every request's draft route and γ for the next step.

    Args:
        cost_model: a calibration (``target_ms``: T_target(k) for k = 1..K,
            ``draft_batch_ms``: T_draft(b) for b = 1..B), or None for priors.
        max_rows: rows one target pass may hold (the context's n_batch).
        max_draft_rows: rows one draft pass may hold.
        min_speedup: a plan that drafts must beat plain continuous batching
            (every γ = 0) by this factor, so estimation noise never makes
            the batch slower than batching alone.
        cost_prior: T_draft(1) / T_target(1) before the draft is timed.
        sweeps: most rounds of coordinate ascent.
    """

    def __init__(self, cost_model: Optional[CostModel] = None, *, max_rows: int = 512,
                 max_draft_rows: int = 512, min_speedup: float = 1.02, cost_prior: float = 0.2,
                 sweeps: int = 4) -> None:
        if max_rows < 1 or max_draft_rows < 1:
            raise ValueError(f"max_rows and max_draft_rows must be >= 1, got {max_rows}, {max_draft_rows}")
        if min_speedup <= 0 or cost_prior < 0:
            raise ValueError("min_speedup must be > 0 and cost_prior >= 0")
        target_seed = None if cost_model is None else [cost_model.target_time(k)
                                                       for k in range(1, min(cost_model.k_max, max_rows) + 1)]
        draft_seed = None
        if cost_model is not None:
            draft_seed = cost_model.draft_batch_ms or ([cost_model.draft_ms] if cost_model.draft_ms > 0 else None)
        self.target = PassTimes(max_rows, target_seed)
        self.draft = PassTimes(max_draft_rows, draft_seed)
        self.max_rows, self.max_draft_rows = max_rows, max_draft_rows
        self.min_speedup, self.cost_prior, self.sweeps = min_speedup, cost_prior, sweeps

    # ------------------------------------------------------------ feedback
    def observe_target(self, rows: int, seconds: float) -> None:
        """One target pass over ``rows`` rows took ``seconds``."""
        self.target.observe(int(rows), 1000.0 * seconds)

    def observe_draft(self, rows: int, seconds: float) -> None:
        """One draft pass over ``rows`` rows took ``seconds``."""
        self.draft.observe(int(rows), 1000.0 * seconds)

    # ------------------------------------------------------------ the choice
    def plan(self, requests: Sequence[PlanRequest], fixed_target_rows: int = 0,
             fixed_draft_rows: int = 0) -> list[tuple[Optional[str], int]]:
        """(route, γ) for every request (route None when γ = 0).

        ``fixed_target_rows`` / ``fixed_draft_rows`` are rows the passes
        carry anyway (prompt chunks being prefilled).
        """
        n = len(requests)
        if n == 0:
            return []
        t = self.target.curve()
        d = self._draft_curve(t)
        state = _State(n, t, d, fixed_target_rows, fixed_draft_rows, self.max_rows, self.max_draft_rows)
        for i, req in enumerate(requests):
            if req.fixed is not None and req.options:
                opt = req.options[0]
                g = min(req.fixed, len(opt.row_alphas), max(self.max_rows - state.rows, 0))
                state.set(i, opt.route, g, costly=opt.costly, catch_up=opt.catch_up,
                          e=_expected(opt.row_alphas, g))
        free = [i for i, r in enumerate(requests) if r.fixed is None and r.options]
        if not free:
            return state.choice()
        plain_rate = state.rate()
        for _ in range(self.sweeps):
            changed = False
            for i in free:
                if state.improve(i, requests[i].options):
                    changed = True
            if not changed:
                break
        if state.rate() < self.min_speedup * plain_rate:
            for i in free:
                state.set(i, None, 0, costly=False, catch_up=0, e=1.0)
        return state.choice()

    def _draft_curve(self, t: np.ndarray) -> np.ndarray:
        if self.draft.measured:
            return self.draft.curve()
        # Not timed yet: the prior draft cost, shaped like a compute-bound pass.
        k = np.arange(self.max_draft_rows + 1, dtype=float)
        return self.cost_prior * t[1] * np.maximum(k, 1.0)

    def rate(self, requests_gammas: Sequence[tuple[Sequence[float], int, bool, int]],
             fixed_target_rows: int = 0, fixed_draft_rows: int = 0) -> float:
        """Expected tokens per millisecond of a given plan (for statistics and
        tests): one (row_alphas, γ, costly, catch_up) per request."""
        t = self.target.curve()
        state = _State(len(requests_gammas), t, self._draft_curve(t), fixed_target_rows, fixed_draft_rows,
                       self.max_rows, self.max_draft_rows)
        for i, (alphas, g, costly, catch_up) in enumerate(requests_gammas):
            state.set(i, "x" if g else None, g, costly=costly, catch_up=catch_up, e=_expected(alphas, g))
        return state.rate()


def _expected(row_alphas: Sequence[float], gamma: int) -> float:
    e, reach = 1.0, 1.0
    for j in range(gamma):
        reach *= row_alphas[j]
        e += reach
    return e


class _State:
    """A plan being improved: per-request (route, γ, E) and the totals the
    step cost depends on, kept incrementally."""

    def __init__(self, n: int, t: np.ndarray, d: np.ndarray, fixed_rows: int, fixed_draft_rows: int,
                 max_rows: int, max_draft_rows: int) -> None:
        self.t, self.d = t.tolist(), d.tolist()
        self.max_rows, self.max_draft_rows = max_rows, max_draft_rows
        self.route: list[Optional[str]] = [None] * n
        self.gamma = [0] * n
        self.costly = [False] * n
        self.catch_up = [0] * n
        self.e = [1.0] * n
        self.rows = fixed_rows + n  # every request has at least its one row
        self.fixed_draft_rows = fixed_draft_rows
        self.depth_rows = [0] * (_MAX_DEPTH + 1)  # draft rows at depth d (catch-up rows included at depth 0)
        self.depth_rows[0] = fixed_draft_rows
        self.total_e = float(n)

    def _t(self, rows: int) -> float:
        if rows < len(self.t):
            return self.t[rows]
        slope = max(self.t[-1] - self.t[-2], 0.0)
        return self.t[-1] + slope * (rows - len(self.t) + 1)

    def _d(self, rows: int) -> float:
        if rows <= 0:
            return 0.0
        if rows < len(self.d):
            return self.d[rows]
        slope = max(self.d[-1] - self.d[-2], 0.0)
        return self.d[-1] + slope * (rows - len(self.d) + 1)

    def _draft_cost(self) -> float:
        return sum(self._d(r) for r in self.depth_rows if r)

    def rate(self) -> float:
        cost = self._t(self.rows) + self._draft_cost()
        return self.total_e / cost if cost > 0 else math.inf

    def set(self, i: int, route: Optional[str], g: int, *, costly: bool, catch_up: int, e: float) -> None:
        self._remove(i)
        self.route[i], self.gamma[i], self.costly[i] = (route if g else None), g, costly and g > 0
        self.catch_up[i] = catch_up if self.costly[i] else 0
        self.e[i] = e
        self.total_e += e
        self.rows += g
        if self.costly[i]:
            self.depth_rows[0] += self.catch_up[i]
            for j in range(1, g):
                self.depth_rows[j] += 1

    def _remove(self, i: int) -> None:
        self.total_e -= self.e[i]
        self.rows -= self.gamma[i]
        if self.costly[i]:
            self.depth_rows[0] -= self.catch_up[i]
            for j in range(1, self.gamma[i]):
                self.depth_rows[j] -= 1
        self.route[i], self.gamma[i], self.costly[i], self.catch_up[i], self.e[i] = None, 0, False, 0, 1.0
        self.total_e += 1.0

    def improve(self, i: int, options: Sequence[DraftOption]) -> bool:
        """Give request i its best (route, γ) given the others; True if it changed."""
        before = (self.route[i], self.gamma[i])
        self._remove(i)
        base_e = self.total_e - 1.0
        base_rows = self.rows  # includes request i's one row
        draft_base = self._draft_cost()
        best = (self.total_e / (self._t(base_rows) + draft_base), None, 0, False, 0, 1.0)
        for opt in options:
            e, reach = 1.0, 1.0
            extra_draft = 0.0
            cap = min(len(opt.row_alphas), self.max_rows - base_rows)
            for g in range(1, cap + 1):
                reach *= opt.row_alphas[g - 1]
                e += reach
                if opt.costly:
                    j = g - 1  # depth of the pass that drafts token g
                    if j >= len(self.depth_rows):
                        break
                    add = opt.catch_up if j == 0 else 1
                    if self.depth_rows[j] + add > self.max_draft_rows:
                        break
                    extra_draft += self._d(self.depth_rows[j] + add) - self._d(self.depth_rows[j])
                rate = (base_e + e) / (self._t(base_rows + g) + draft_base + extra_draft)
                if rate > best[0] * (1.0 + 1e-12):
                    best = (rate, opt.route, g, opt.costly, opt.catch_up, e)
        _, route, g, costly, catch_up, e = best
        self.set(i, route, g, costly=costly, catch_up=catch_up, e=e)
        return (self.route[i], self.gamma[i]) != before

    def choice(self) -> list[tuple[Optional[str], int]]:
        return list(zip(self.route, self.gamma))
