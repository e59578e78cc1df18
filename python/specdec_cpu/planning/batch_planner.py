"""γ for every request of a batch: the draft lengths that maximise the batch's
expected emitted tokens per second (docs/serving.md §2).

With requests i = 1..B in one step, request i drafting γᵢ tokens, the step costs

    T_step = T_target(R₀ + Σᵢ (γᵢ + 1)) + Σ_d T_draft(B_d)

(R₀: prompt rows processed in the same pass; B_d: rows of the draft model's
pass at depth d, i.e. the requests still drafting at that depth, plus the
tokens a request's draft cache catches up on at depth 0) and emits
Σᵢ E[tokens]ᵢ(γᵢ) tokens in expectation.  Prompt and catch-up rows are done
anyway: a plan is judged by its tokens over the time decoding adds to them
(T_step − T_target(R₀) − T_draft(catch-up rows)), E = 1 + α₀ + α₀α₁ + ... from each
request's own row acceptances.  :meth:`BatchPlanner.plan` maximises the
ratio by coordinate ascent: each request in turn takes the (route, γ) that
is best given the others, until nothing changes.  With one request that is
an exhaustive search over γ, i.e. the single-request rule
E / (γ·c + v(γ + 1)); with many, the rows stop being free and the γᵢ fall
towards 0 (continuous batching alone) by themselves.

The cost model leaves things out (sampling, the scheduler's own time, an
α̂ that lags a change of text), and near the break-even batch size a few
percent decide whether drafting pays.  So the planner also keeps score:
for every batch size, the tokens steps really emitted against what their
plans predicted for the time they took, separately for drafting and plain
steps (:class:`Realised`).  Where drafting did worse against its plans
than plain steps did against theirs, a drafting plan must beat plain
batching by that much more; where drafting fell short it stops, and the
shortfall halves every ~70 plain steps, so it is tried again later
(docs/serving.md §2).  What a plan sets aside (a draft catching up before
the steps that draft) is kept in a :class:`~.ledger.DraftingLedger` that
the scheduler asks before it invests in drafting again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..core.request_args import GAMMA_LIMIT
from .costmodel import CostModel
from .ledger import DraftingLedger
from .pass_times import PassTimes

__all__ = ["BatchPlanner", "DraftOption", "PlanRequest", "AlphaTracker", "Realised", "row_weight"]

_MAX_DEPTH = GAMMA_LIMIT  # the longest draft any route may propose
_REST_EVIDENCE = 8  # later rows after which first rows stop teaching the later-row estimate
#: pass-time estimates (pass_times.py): a measured count follows no other count's
#: drift (a band of 1: itself), a count only seeded follows the measured counts'
#: median drift, and one reading counts as at most MAX_JUMP times the estimate.
#: A band of 2 (counts within a factor 2 follow each other) compounded: at eight
#: requests, while drafting ran 9- to 16-row passes, the 8-row time of plain
#: batching was carried up by their changes to 5.8x the plain passes, and γ=auto
#: drafted at 0.55-0.82x γ=0 from then on (8 blocks in two runs).
DRIFT_BAND = 1.0
MAX_JUMP = 1.3
#: No request's expected rate may fall below this share of what plain batching
#: gives it (one token per plain step).  The batch's best rate alone lets a
#: request whose drafts are accepted well draft long, and every step then
#: takes that long for all: traced at two requests of the default pair, the
#: other request, drafting 2 at α 0.8, got 2.5 tokens per 320 ms step (0.67x
#: its plain-batching rate), fell behind, and decoded its last ~70 tokens
#: alone at the single-request rate; the batch's steps had run 1.2-1.35x
#: plain batching, the whole burst 1.0-1.2x.  Below 1 a request that cannot
#: draft (a fixed γ = 0, its last token) still lets the others draft a little.
NO_HARM = 0.9


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
        free: leading rows that need no draft pass (tokens a grammar forces:
            α = 1); a costly option's passes draft the rows after them.
    """

    route: str
    row_alphas: Sequence[float]
    costly: bool = True
    catch_up: int = 1
    free: int = 0


@dataclass
class PlanRequest:
    """A request to plan for: the ways it could draft.

    ``fixed`` is the γ of a request that asked for one (``gamma=N``): it then
    drafts ``min(fixed, len(row_alphas))`` tokens through its first option,
    and only the other requests are planned around it.
    """

    options: Sequence[DraftOption] = ()
    fixed: Optional[int] = None


def row_weight(ema: float, prior_rows: float, seen: int) -> float:
    """The weight of an acceptance estimate's next row after ``seen`` rows:
    a running mean that counts the starting value as ``prior_rows`` rows,
    until its weight falls to the moving average's ``ema``."""
    return max(ema, 1.0 / (prior_rows + seen + 1))


@dataclass
class AlphaTracker:
    """Moving averages of one drafter's acceptance: of a draft's first row,
    and of later rows given the earlier ones were accepted (drafts of
    predictable text are accepted in runs, which one α cannot express).

    The starting values count as ``prior_rows`` observed rows: the n-th row
    of a kind weighs 1 / (prior_rows + n) until that falls to ``ema``, so the
    first rows move a guess most of the way to what they measured (a running
    mean with the prior as pseudo-rows), and later ones track a change of
    text at the ``ema`` rate.  With the ``ema`` weight from the first row, a
    pair accepted at 0.92 was still planned at 0.72 after its first probe
    (docs/serving.md §2).
    """

    first: float = 0.7
    rest: float = 0.7
    ema: float = 0.1
    prior_rows: float = 2.0
    stale: int = field(default=0, repr=False)  # plain steps since the last observation
    rest_rows: int = field(default=0, repr=False)  # later rows observed so far
    first_rows: int = field(default=0, repr=False)  # first rows observed so far

    def observe(self, rows: Sequence[float]) -> None:
        """Learn from the exact Σ min(p, q) of one step's verified rows.

        Until later rows have been seen (γ = 1 drafts verify only a first
        row), first rows teach both estimates: otherwise a pessimistic prior
        for later rows would keep γ at 1 and never be corrected."""
        w = self._weight(self.first_rows)
        if self.stale:  # an old estimate: the first new row counts for more
            w = max(w, min(0.5, 1.0 - (1.0 - self.ema) ** (1 + self.stale)))
        for j, a in enumerate(rows):
            a = min(max(float(a), 0.0), 1.0)
            if j == 0:
                self.first += w * (a - self.first)
                self.first_rows += 1
                if self.rest_rows < _REST_EVIDENCE:
                    self.rest += w * (a - self.rest)
            else:
                self.rest += self._weight(self.rest_rows) * (a - self.rest)
                self.rest_rows += 1
        if rows:
            self.stale = 0

    def _weight(self, seen: int) -> float:
        """The weight of the next row of a kind after ``seen`` of them."""
        return row_weight(self.ema, self.prior_rows, seen)

    def row_alphas(self, n: int) -> list[float]:
        """α̂ of rows 0..n−1."""
        return [self.first] + [self.rest] * (n - 1) if n > 0 else []


@dataclass
class Realised:
    """How steps of one kind (a batch size, drafting or plain) did against
    their plans: moving averages of the tokens they emitted and of the
    tokens their plans predicted for the time they took.

    The prediction is scaled by the step's real duration, so a step that
    took longer than planned (a pass slower than its curve, a cost the
    model leaves out) counts against its kind as much as one that emitted
    fewer tokens.
    """

    tokens: float = 0.0
    predicted: float = 0.0
    steps: int = 0
    ema: float = 0.1
    #: steps after which the ratio is trusted (before: 1, the cost model as it is)
    min_steps: int = 4
    #: the ratio is kept within these bounds (a wild run of steps cannot switch drafting off for good)
    bounds: tuple[float, float] = (0.5, 1.25)

    def observe(self, emitted: float, predicted: float) -> None:
        """One step: ``emitted`` tokens where its plan predicted ``predicted`` in the time it took."""
        if not (math.isfinite(emitted) and math.isfinite(predicted)) or predicted <= 0:
            return
        w = 1.0 / (self.steps + 1) if self.steps < 1.0 / self.ema else self.ema  # a plain mean at first
        self.tokens += w * (emitted - self.tokens)
        self.predicted += w * (predicted - self.predicted)
        self.steps += 1

    def forget(self, weight: float) -> None:
        """Move the ratio towards 1 (evidence ages while this kind of step is not run)."""
        self.tokens += weight * (self.predicted - self.tokens)

    def ratio(self) -> float:
        """Realised / predicted tokens (1 until ``min_steps`` steps were seen)."""
        if self.steps < self.min_steps or self.predicted <= 0:
            return 1.0
        lo, hi = self.bounds
        return min(max(self.tokens / self.predicted, lo), hi)


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
        forget: per plain step of a batch size, how far that size's
            drafting record moves back towards "as predicted".
        no_harm: a plan must leave every request at least this share of
            the rate plain batching gives it (expected tokens over the
            step's time; 0: no such rule).
    """

    def __init__(self, cost_model: Optional[CostModel] = None, *, max_rows: int = 512,
                 max_draft_rows: int = 512, min_speedup: float = 1.02, cost_prior: float = 0.2,
                 sweeps: int = 4, forget: float = 0.01, no_harm: float = NO_HARM) -> None:
        if max_rows < 1 or max_draft_rows < 1:
            raise ValueError(f"max_rows and max_draft_rows must be >= 1, got {max_rows}, {max_draft_rows}")
        if min_speedup <= 0 or cost_prior < 0:
            raise ValueError("min_speedup must be > 0 and cost_prior >= 0")
        if not 0.0 <= no_harm <= 1.0:
            raise ValueError(f"no_harm must be in [0, 1], got {no_harm}")
        target_seed = None if cost_model is None else [cost_model.target_time(k)
                                                       for k in range(1, min(cost_model.k_max, max_rows) + 1)]
        draft_seed = None
        if cost_model is not None:
            draft_seed = cost_model.draft_batch_ms or ([cost_model.draft_ms] if cost_model.draft_ms > 0 else None)
        # Passes of a few rows to hundreds: a count follows only its neighbours'
        # drift, and one slow pass moves it by 6% at most (pass_times.py).
        self.target = PassTimes(max_rows, target_seed, drift_band=DRIFT_BAND, max_jump=MAX_JUMP)
        self.draft = PassTimes(max_draft_rows, draft_seed, drift_band=DRIFT_BAND, max_jump=MAX_JUMP)
        self.max_rows, self.max_draft_rows = max_rows, max_draft_rows
        self.min_speedup, self.cost_prior, self.sweeps, self.forget = min_speedup, cost_prior, sweeps, forget
        self.no_harm = no_harm
        #: expected tokens per millisecond of the last plan returned
        self.last_rate = 0.0
        #: (batch size, drafting) -> how such steps did against their plans
        self.realised: dict[tuple[int, bool], Realised] = {}
        #: per batch size, the tokens drafting gained over plain batching, catch-ups included
        self.ledger = DraftingLedger(forget=forget)

    # ------------------------------------------------------------ feedback
    def observe_target(self, rows: int, seconds: float) -> None:
        """One target pass over ``rows`` rows took ``seconds``."""
        self.target.observe(int(rows), 1000.0 * seconds)

    def observe_draft(self, rows: int, seconds: float) -> None:
        """One draft pass over ``rows`` rows took ``seconds``."""
        self.draft.observe(int(rows), 1000.0 * seconds)

    def observe_step(self, batch: int, drafting: bool, planned_rate: float, emitted: int, seconds: float) -> None:
        """A decoding step of ``batch`` requests (no prompt rows in its passes)
        ran a plan of ``planned_rate`` tokens/ms, drafting or not, and emitted
        ``emitted`` tokens in ``seconds``."""
        if batch < 1 or seconds <= 0 or planned_rate <= 0:
            return
        self.realised.setdefault((batch, drafting), Realised()).observe(emitted, planned_rate * 1000.0 * seconds)
        if not drafting and (batch, True) in self.realised:
            self.realised[(batch, True)].forget(self.forget)

    def observe_balance(self, batch: int, drafting: bool, emitted: int, seconds: float) -> None:
        """A step of ``batch`` decoding requests (no prompt rows) that drafted
        or caught a draft up (``drafting``), or did neither, emitted ``emitted``
        tokens in ``seconds``: the ledger counts what the first kind gained over
        plain batching's rate (predicted, corrected by how plain steps of this
        size did against their predictions), and ages with the second."""
        if batch < 1 or seconds <= 0:
            return
        if not drafting:
            self.ledger.plain_step(batch)
            return
        plain = self.plain_rate(batch)
        if (batch, False) in self.realised:
            plain *= self.realised[(batch, False)].ratio()
        self.ledger.record(batch, emitted - plain * 1000.0 * seconds)

    def may_invest(self, batch: int) -> bool:
        """Whether to spend on drafting ahead of the steps that draft (a
        draft's catch-up, a probe) at ``batch`` requests: not where drafting
        has not yet paid back what it cost there."""
        return self.ledger.may_invest(batch)

    def _drafting_beats_plain(self, batch: int, drafting_rate: float, plain_rate: float, margin: float) -> bool:
        """Whether a drafting plan beats plain batching by ``margin`` once
        corrected by how drafting steps of this batch size did relative to
        plain ones.

        The correction only ever vetoes: a shortfall of plain steps (a
        per-step cost the model leaves out weighs more on short steps) never
        makes the planner draft where the cost model says no — drafting's own
        one-off costs (a draft catching up after a prompt) are not in its
        record, so a relative advantage measured without them is not trusted
        (measured: letting it count tripled the tokens drafted at four
        requests and lost throughput).  Before drafting steps of a batch
        size are scored, a plain record above 1 already vetoes a marginal
        draft: conservative, and the rule every serving measurement since the
        drafting ledger was made with (waiting for four drafting steps instead
        was tried; its runs at eight requests ran away through a pass-time
        error, fixed since, so they did not decide it; bench/HISTORY.md,
        "Serving at K = 4")."""
        r = self.realised
        d = r[(batch, True)].ratio() if (batch, True) in r else 1.0
        p = r[(batch, False)].ratio() if (batch, False) in r else 1.0
        return drafting_rate * min(d / p, 1.0) > margin * plain_rate

    # ------------------------------------------------------------ the choice
    def plan(self, requests: Sequence[PlanRequest], fixed_target_rows: int = 0,
             fixed_draft_rows: int = 0) -> list[tuple[Optional[str], int]]:
        """(route, γ) for every request (route None when γ = 0).

        ``fixed_target_rows`` / ``fixed_draft_rows`` are rows the passes
        carry anyway (prompt chunks being prefilled).
        """
        n = len(requests)
        if n == 0:
            self.last_rate = 0.0
            return []
        t = self.target.curve_list()
        state = _State(n, t, self._draft_curve(t), fixed_target_rows, fixed_draft_rows,
                       self.max_rows, self.max_draft_rows)
        options = [[_Option(o) for o in r.options] for r in requests]
        for i, req in enumerate(requests):
            if req.fixed is not None and options[i]:
                opt = options[i][0]
                state.set(i, opt, min(req.fixed, opt.n, max(self.max_rows - state.rows, 0)))
        free = [i for i, r in enumerate(requests) if r.fixed is None and options[i]]
        if not free:
            self.last_rate = state.rate()
            return state.choice()
        plain_rate = state.rate()
        # Start from the best uniform γ: a draft pass is shared by every request
        # drafting at its depth, so drafting may pay for the batch while it pays
        # for no single request moving alone (a local optimum of coordinate moves).
        best_rate, best_g = plain_rate, 0
        share = self.no_harm if n > 1 else 0.0
        for g in range(1, max(o.n for i in free for o in options[i]) + 1):
            rate = state.uniform_rate(free, options, g, share)
            if rate > best_rate:
                best_rate, best_g = rate, g
        if best_g:
            for i in free:
                opt = max(options[i], key=lambda o: o.cum_e[min(best_g, o.n)])
                state.set(i, opt, min(best_g, opt.n, max(self.max_rows - state.rows, 0)))
        for _ in range(self.sweeps):
            changed = False
            for i in free:
                if state.improve(i, options[i], share):
                    changed = True
            if not changed:
                break
        while not state.harmless(share):  # (a request with a fixed γ may leave it so) shorten the longest draft
            drafting = [i for i in free if state.gamma[i] > 0]
            if not drafting:
                break
            i = max(drafting, key=lambda j: state.gamma[j])
            state.set(i, state.opt[i], state.gamma[i] - 1)
        if not self._drafting_beats_plain(n, state.rate(), plain_rate, self.min_speedup):
            for i in free:
                state.set(i, None, 0)
        self.last_rate = state.rate()
        return state.choice()

    def _draft_curve(self, t: Sequence[float]) -> list[float]:
        if self.draft.measured:
            return self.draft.curve_list()
        # Not timed yet: the prior draft cost, shaped like a compute-bound pass.
        return [self.cost_prior * t[1] * max(k, 1) for k in range(self.max_draft_rows + 1)]

    def drafting_could_pay(self, batch: int, gamma: int, catch_up: int, alpha: float,
                           fixed_target_rows: int = 0, margin: Optional[float] = None) -> bool:
        """Whether one request of a ``batch`` of plain requests drafting ``gamma``
        tokens with the draft model (after taking in ``catch_up`` rows), each
        accepted with probability ``alpha``, would raise the batch's expected
        rate above plain continuous batching by ``margin`` (default ``min_speedup``)."""
        if batch < 1 or gamma < 1:
            return False
        plain = [((), 0, False, 0)] * batch
        drafting = [([alpha] * gamma, gamma, True, max(catch_up, 1))] + plain[1:]
        margin = self.min_speedup if margin is None else margin
        return self._drafting_beats_plain(batch, self.rate(drafting, fixed_target_rows),
                                          self.plain_rate(batch, fixed_target_rows), margin)

    def plain_rate(self, batch: int, fixed_target_rows: int = 0) -> float:
        """Expected tokens per millisecond of ``batch`` requests decoding without drafts."""
        return self.rate([((), 0, False, 0)] * batch, fixed_target_rows)

    def rate(self, requests_gammas: Sequence[tuple[Sequence[float], int, bool, int]],
             fixed_target_rows: int = 0, fixed_draft_rows: int = 0) -> float:
        """Expected tokens per millisecond of a given plan (for statistics and
        tests): one (row_alphas, γ, costly, catch_up) per request."""
        t = self.target.curve_list()
        state = _State(len(requests_gammas), t, self._draft_curve(t), fixed_target_rows,
                       fixed_draft_rows, self.max_rows, self.max_draft_rows)
        for i, (alphas, g, costly, catch_up) in enumerate(requests_gammas):
            state.set(i, _Option(DraftOption("x", alphas, costly, catch_up)), g)
        return state.rate()


class _Option:
    """A DraftOption with E[tokens] precomputed for every γ."""

    __slots__ = ("route", "costly", "catch_up", "free", "n", "cum_e")

    def __init__(self, opt: DraftOption) -> None:
        self.route, self.costly, self.catch_up, self.free = opt.route, opt.costly, opt.catch_up, opt.free
        self.n = len(opt.row_alphas)
        e, reach, cum = 1.0, 1.0, [1.0]
        for a in opt.row_alphas:  # E(γ) = 1 + α0 + α0·α1 + ...
            reach *= a
            e += reach
            cum.append(e)
        self.cum_e = cum


class _State:
    """A plan being improved: per-request (option, γ) and the totals the
    step's cost depends on, all kept incrementally."""

    def __init__(self, n: int, t: list[float], d: list[float], fixed_rows: int, fixed_draft_rows: int,
                 max_rows: int, max_draft_rows: int) -> None:
        self.t, self.d = t, d
        self.max_rows, self.max_draft_rows = max_rows, max_draft_rows
        self.opt: list[Optional[_Option]] = [None] * n
        self.gamma = [0] * n
        self.e = [1.0] * n  # each request's expected tokens this step
        self.rows = fixed_rows + n  # every request has at least its one row
        self.total_e = float(n)
        self.depth_rows = [0] * (_MAX_DEPTH + 1)  # draft rows at depth d (catch-up rows at depth 0)
        self.depth_rows[0] = fixed_draft_rows
        self.draft_cost = self._d(fixed_draft_rows)
        # Prompt and catch-up rows are work the passes do anyway: the plan is
        # judged on what decoding adds to them (on a pass full of prompt rows,
        # extra rows cost their compute and a draft pass its whole time).
        self.sunk = (self._t(fixed_rows) if fixed_rows else 0.0) + self.draft_cost
        # Learnt curves need not be monotone: the time a plan adds is kept positive.
        self.floor = 0.01 * max(self._t(1), 1e-9)
        # What plain batching's step adds to the prompt rows: each request's token
        # comes at 1 / t_plain there (the reference of the no-harm rule).
        self.t_plain = max(self._t(fixed_rows + n) - (self._t(fixed_rows) if fixed_rows else 0.0), self.floor)

    def uniform_rate(self, free: Sequence[int], options: Sequence[Sequence[_Option]], g: int,
                     share: float = 0.0) -> float:
        """The rate if every request of ``free`` (now plain) drafted γ = g
        through its best option (fewer where an option or the pass is
        shorter); 0 if a draft pass would not fit, or if a request would
        get less than ``share`` of its plain-batching rate."""
        total_e, rows = self.total_e, self.rows
        depth = list(self.depth_rows[:g])
        e = list(self.e)
        for i in free:
            opt = max(options[i], key=lambda o: o.cum_e[min(g, o.n)])
            gi = min(g, opt.n, max(self.max_rows - rows, 0))
            total_e += opt.cum_e[gi] - 1.0
            e[i] = opt.cum_e[gi]
            rows += gi
            passes = gi - opt.free
            if opt.costly and passes > 0:
                depth[0] += opt.catch_up
                for j in range(1, passes):
                    depth[j] += 1
        if max(depth) > self.max_draft_rows:
            return 0.0
        draft_cost = self.draft_cost + sum(self._d(r) - self._d(r0) for r, r0 in zip(depth, self.depth_rows))
        time = max(self._t(rows) + draft_cost - self.sunk, self.floor)
        if not self._harmless(min(e), time, share):
            return 0.0
        return total_e / time

    def _t(self, rows: int) -> float:
        t = self.t
        if rows < len(t):
            return t[rows]
        return t[-1] + max(t[-1] - t[-2], 0.0) * (rows - len(t) + 1)

    def _d(self, rows: int) -> float:
        d = self.d
        if rows <= 0:
            return 0.0
        if rows < len(d):
            return d[rows]
        return d[-1] + max(d[-1] - d[-2], 0.0) * (rows - len(d) + 1)

    def time(self) -> float:
        """What the plan adds to the step's prompt and catch-up rows (ms)."""
        return max(self._t(self.rows) + self.draft_cost - self.sunk, self.floor)

    def rate(self) -> float:
        return self.total_e / self.time()

    def _harmless(self, min_e: float, time: float, share: float) -> bool:
        """Whether the request expecting fewest tokens, ``min_e`` in ``time``,
        gets at least ``share`` of its rate under plain batching."""
        return min_e * self.t_plain >= share * time * (1.0 - 1e-12)

    def harmless(self, share: float) -> bool:
        """Whether every request gets at least ``share`` of its plain-batching rate."""
        return self._harmless(min(self.e), self.time(), share)

    def feasible(self) -> bool:
        """Whether every draft pass fits its context's batch."""
        return max(self.depth_rows) <= self.max_draft_rows

    def _add_draft_rows(self, depth: int, k: int) -> None:
        before = self.depth_rows[depth]
        self.depth_rows[depth] = before + k
        self.draft_cost += self._d(before + k) - self._d(before)

    def set(self, i: int, opt: Optional[_Option], g: int) -> None:
        self._remove(i)
        if opt is None or g <= 0:
            return
        self.opt[i], self.gamma[i], self.e[i] = opt, g, opt.cum_e[g]
        self.total_e += opt.cum_e[g] - 1.0  # _remove left the request counted as one plain token
        self.rows += g
        passes = g - opt.free
        if opt.costly and passes > 0:
            self._add_draft_rows(0, opt.catch_up)
            for j in range(1, passes):
                self._add_draft_rows(j, 1)

    def _remove(self, i: int) -> None:
        opt, g = self.opt[i], self.gamma[i]
        if opt is None:
            return
        self.total_e -= opt.cum_e[g] - 1.0
        self.rows -= g
        passes = g - opt.free
        if opt.costly and passes > 0:
            self._add_draft_rows(0, -opt.catch_up)
            for j in range(1, passes):
                self._add_draft_rows(j, -1)
        self.opt[i], self.gamma[i], self.e[i] = None, 0, 1.0

    def improve(self, i: int, options: Sequence[_Option], share: float = 0.0) -> bool:
        """Give request i its best (option, γ) given the others, among those
        that leave every request ``share`` of its plain-batching rate (plain
        when none does); True if it changed."""
        before = (self.opt[i], self.gamma[i])
        self._remove(i)
        base_e = self.total_e - 1.0
        base_rows = self.rows  # includes request i's one row
        draft_base = self.draft_cost - self.sunk
        others = min((e for j, e in enumerate(self.e) if j != i), default=math.inf)
        time = max(self._t(base_rows) + draft_base, self.floor)
        best_rate, best_opt, best_g = self.total_e / time, None, 0
        if not self._harmless(1.0, time, share):  # i plain: one token (the others expect >= 1)
            best_rate = -1.0  # any harmless choice beats it; else i stays plain (the shortest step)
        room = self.max_rows - base_rows
        for opt in options:
            extra_draft = 0.0
            cum = opt.cum_e
            for g in range(1, min(opt.n, room) + 1):
                if opt.costly and g > opt.free:
                    j = g - 1 - opt.free  # depth of the pass that drafts token g
                    if j > _MAX_DEPTH:
                        break
                    have = self.depth_rows[j]
                    add = opt.catch_up if j == 0 else 1
                    if have + add > self.max_draft_rows:
                        break
                    extra_draft += self._d(have + add) - self._d(have)
                time = max(self._t(base_rows + g) + draft_base + extra_draft, self.floor)
                rate = (base_e + cum[g]) / time
                if rate > best_rate * (1.0 + 1e-12) and self._harmless(min(others, cum[g]), time, share):
                    best_rate, best_opt, best_g = rate, opt, g
        self.set(i, best_opt, best_g)
        return (self.opt[i], self.gamma[i]) != before

    def choice(self) -> list[tuple[Optional[str], int]]:
        return [(o.route if o is not None and g else None, g) for o, g in zip(self.opt, self.gamma)]
