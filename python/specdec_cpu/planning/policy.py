"""The draft policy: each step's route and γ for every decoding sequence.

One policy serves every decoder: a ``SpeculativeDecoder`` is its K = 1
case, a ``BatchedDecoder`` step plans K sequences at once.  Per step, the
loop describes each decoding sequence as a :class:`Candidate` (its γ
setting, room, lookup match, how far its draft cache lags) and gets a
:class:`Decision` back; after the verify it hands the outcome to
:meth:`DraftPolicy.learn`.  Around the optimisation itself
(:class:`~.batch_planner.BatchPlanner`: the γ vector maximising expected
tokens per second) the policy decides what the optimiser cannot see:

- **acceptance estimates**: each sequence's α̂ of the draft model (the
  pair's until it has drafted), α̂ per match length for lookups
  (:class:`~.match_alphas.MatchAlphas`);
- **probes**: after a plain stretch a sequence's α̂ is stale; every
  ``probe_interval`` plain steps it drafts PROBE_GAMMA tokens to re-measure
  it, if drafting could pay at all (the interval doubles after a probe that
  found nothing, up to ``probe_max``); a draft that fell far behind
  meanwhile catches up first, where that would repay itself at a good
  acceptance;
- **exploring**: while the pair's acceptance is only ALPHA_GUESS, the first
  sequence that may draft probes at once, and again at each step its plan
  would not draft until the pair has EXPLORE_ROWS first rows (one row is
  too little to give up a draft on: at T = 0 it is a 0 or a 1);
- **catch-up**: a draft cache lagging by more than IN_STEP_LAG tokens catches
  up in prompt-sized chunks only when the drafting it enables repays it
  (:meth:`DraftPolicy._catch_up`).

The measurements behind the constants are in docs/planning.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from .batch_planner import AlphaTracker, BatchPlanner, DraftOption, PlanRequest
from .costmodel import CostModel
from .match_alphas import MatchAlphas

__all__ = ["ALPHA_GUESS", "EXPLORE_ROWS", "FORCED", "MODEL", "NGRAM", "Candidate", "Decision", "DraftPolicy",
           "SequencePlan"]

#: The routes: the draft model, prompt lookup, and a grammar's forced tokens alone.
MODEL, NGRAM, FORCED = "model", "ngram", "forced"

#: A lag the first draft pass of a step takes in, charged to the plan (a drafting step's own lag).
IN_STEP_LAG = 4
#: The same for a constrained sequence, whose forced tokens leave its draft behind by a few more
#: (a plain step to catch up cost the JSON workload a third of its steps: bench/structured.py).
IN_STEP_LAG_CONSTRAINED = 16
#: The longest lag a probe or a fixed-γ sequence takes in within a batch's drafting step.
CATCH_UP_LIMIT = 64
#: A catch-up must save this many times its cost (docs/planning.md §3).
CATCH_UP_PAYBACK = 1.5
#: ... over at most this many of the sequence's remaining tokens: a drafting stretch in a batch is short (§3).
EXPECTED_TOKENS = 64
#: The same for a sequence decoding alone, whose stretch only its finish or an arrival ends (§3).
EXPECTED_TOKENS_ALONE = 256
#: A catch-up or a probe is made only when drafting is predicted to beat plain batching by this (§3).
INVESTMENT_GAIN = 1.05
#: The draft's lag after catching up, as the plan charges it: the step's own token.
CAUGHT_UP_LAG = 2
#: Draft tokens of a probe.
PROBE_GAMMA = 2
#: A probe is made only if drafting could pay at this acceptance (as good as drafts get).
OPTIMISTIC_ALPHA = 0.95
#: The pair's acceptance before anything is measured (a guess, explored at once: §2).
ALPHA_GUESS = 0.7
#: First rows the pair's acceptance needs before it replaces the guess for
#: good; fewer, and a step that would not draft explores instead (§2).
EXPLORE_ROWS = 4


@dataclass
class SequencePlan:
    """The policy's state of one sequence."""

    alpha: AlphaTracker  # its acceptance of the draft model
    probe_interval: int
    plain_run: int = 0  # consecutive plain steps (for probes)
    probe_pending: bool = False  # its draft caught up for a probe: the probe comes next


@dataclass
class Candidate:
    """A decoding sequence as the policy sees it in one step.

    Attributes:
        plan: its :class:`SequencePlan` (from :meth:`DraftPolicy.admit`).
        gamma: a fixed γ (0: never drafts) or ``"auto"``.
        room: draft tokens the step may propose (within max_tokens and the context).
        remaining: tokens it may still emit.
        match: the lookup's offer after its text (``NgramDrafter.match``), if any.
        lookup_max: the lookup's longest draft.
        draft_lag: tokens the draft model's cache lacks, the last one
            included (None without a draft model).
        forced: the tokens a grammar forces next (drafts that cost no pass).
        constrained: whether a grammar constrains it (its draft falls behind
            by the forced tokens of steps that did not run it).
    """

    plan: SequencePlan
    gamma: Union[int, str]
    room: int
    remaining: int
    constrained: bool = False
    match: Any = None
    lookup_max: int = 0
    draft_lag: Optional[int] = None
    forced: Sequence[int] = ()


@dataclass
class Decision:
    """One sequence's plan for the step.

    ``catch_up`` is how many tokens its draft cache takes in as a chunk of
    the step's first draft pass (before it drafts, in a later step);
    ``alpha_hat`` the α̂ its draft rows were planned with.
    """

    route: Optional[str] = None
    gamma: int = 0
    forced: int = 0  # of the γ rows, how many are forced tokens (always first)
    probe: bool = False
    explore: bool = False
    match: Any = None
    catch_up: int = 0
    alpha_hat: tuple = ()
    lagging: bool = field(default=False, repr=False)
    probe_due: bool = field(default=False, repr=False)
    batch: int = field(default=1, repr=False)  # sequences planned together


class DraftPolicy:
    """Plans every step; see the module docstring.

    Args:
        cost_model: the pair's calibration (pass times, maybe α), or None.
        max_rows, max_draft_rows: rows one target / draft pass may hold.
        has_draft: whether a draft model is loaded.
        gamma_max: the longest model draft.
        catch_up_limit: the longest lag a probe or a fixed γ takes in within
            its drafting step (CATCH_UP_LIMIT in a batch, which a long
            catch-up would hold up; a pass's worth for one sequence).
        probe_every, probe_max: the probe interval and its cap.
    """

    def __init__(self, cost_model: Optional[CostModel], *, max_rows: int, max_draft_rows: int, has_draft: bool,
                 gamma_max: int, probe_every: int = 32, probe_max: int = 256,
                 catch_up_limit: int = CATCH_UP_LIMIT) -> None:
        self.planner = BatchPlanner(cost_model, max_rows=max_rows, max_draft_rows=max_draft_rows)
        self.has_draft, self.gamma_max = has_draft, gamma_max
        self.catch_up_limit = catch_up_limit
        self.probe_every, self.probe_max = probe_every, probe_max
        self.match_alphas = MatchAlphas()
        # The pair's acceptance: measured by a calibration, or a guess that the
        # first rows drafted replace (a guess counts as one row) and that a
        # sequence explores before anyone relies on it.
        alpha = cost_model.alpha if cost_model is not None else None
        self.alpha_known = alpha is not None
        prior = ALPHA_GUESS if alpha is None else alpha
        self.pair_alpha = AlphaTracker(first=prior, rest=prior, ema=0.05,
                                       prior_rows=20.0 if self.alpha_known else 1.0)
        #: the gain over plain batching the last catch-up was made on (0: none)
        self.catch_up_gain = 0.0

    @property
    def last_rate(self) -> float:
        """Expected tokens per ms of the plan last returned."""
        return self.planner.last_rate

    # ------------------------------------------------------------ sequences
    def admit(self) -> SequencePlan:
        """The state of a new sequence: seeded by the pair's α̂, as two rows
        where it was measured, as one while it is the guess."""
        measured = self.alpha_known or self.pair_alpha.first_rows > 0
        alpha = AlphaTracker(first=self.pair_alpha.first, rest=self.pair_alpha.rest,
                             prior_rows=2.0 if measured else 1.0)
        return SequencePlan(alpha=alpha, probe_interval=self.probe_every)

    # ------------------------------------------------------------ the plan
    def plan(self, cands: Sequence[Candidate], fixed_rows: int = 0, joining: int = 0,
             catch_up_budget: int = 0) -> list[Decision]:
        """Every candidate's decision for the step.

        ``fixed_rows``: prompt rows the target pass carries anyway;
        ``joining``: sequences taking in their prompt or waiting (the batch
        is about to grow); ``catch_up_budget``: rows the first draft pass
        may spend on catch-up chunks (a catch-up goes in chunks of this size).

        The draft model takes in a sequence's text lazily: a lag of more
        than IN_STEP_LAG tokens is planned without the model route, and
        again as if caught up; when that plan drafts with the model and the
        saving repays the catch-up, a chunk of it is taken in this step.
        """
        decisions = [Decision(batch=len(cands)) for _ in cands]
        explorer = self._explorer(cands)
        # Explored once already: explore again only where the plan would not draft.
        again = explorer is not None and self.pair_alpha.first_rows > 0
        plans = [self._options(c, d, len(cands), fixed_rows, explore=i == explorer and not again)
                 for i, (c, d) in enumerate(zip(cands, decisions))]
        choice = self.planner.plan(plans, fixed_rows)
        if again and explorer is not None and choice[explorer][0] != MODEL:
            decisions[explorer] = d = Decision(batch=len(cands))
            plans[explorer] = self._options(cands[explorer], d, len(cands), fixed_rows, explore=True)
            if d.explore:
                choice = self.planner.plan(plans, fixed_rows)
        rate = self.planner.last_rate
        self.catch_up_gain = 0.0
        lagging = [i for i, d in enumerate(decisions) if d.lagging]
        if lagging and self._catch_up(cands, decisions, plans, lagging, fixed_rows, joining, catch_up_budget):
            # plan again with the catch-up rows in the first draft pass
            choice = self.planner.plan(plans, fixed_rows, sum(d.catch_up for d in decisions))
        else:
            self.planner.last_rate = rate  # the rate of the plan chosen, not of _catch_up's what-if
        for c, d, plan, (route, g) in zip(cands, decisions, plans, choice):
            d.route, d.gamma = route, g
            d.forced = min(g, len(c.forced)) if route is not None else 0
            d.alpha_hat = next((tuple(o.row_alphas[:g]) for o in plan.options if o.route == route and g), ())
        return decisions

    def _options(self, c: Candidate, d: Decision, batch: int, fixed_rows: int, explore: bool) -> PlanRequest:
        """How ``c`` could draft this step (and whether it probes).

        Tokens a grammar forces (``c.forced``) lead every option as rows of
        α = 1 that need no draft pass: the lookup continues after them, the
        draft model takes them in with its first pass, and alone they are
        the FORCED route (free drafts, docs/math.md §11)."""
        if c.gamma == 0 or c.room == 0:
            return PlanRequest()
        options = []
        fixed = c.gamma if isinstance(c.gamma, int) else None
        if c.match is not None:
            d.match = c.match
        if fixed is None and not self.planner.target.known(1):
            # Nothing is known of a pass's cost yet (no calibration, no pass of one
            # row): the step is plain, and measures T(1) (docs/planning.md §4).
            return PlanRequest()
        f = min(len(c.forced), c.room)
        forced = [1.0] * f
        if c.match is not None:
            n = min(c.room, fixed if fixed is not None else f + c.lookup_max) - f
            if n > 0:
                options.append(DraftOption(NGRAM, forced + self.match_alphas.row_alphas(
                    c.match.length, c.match.unanimous, n), costly=False, catch_up=0))
        probe = False
        if c.draft_lag is not None:
            lag = c.draft_lag
            explore = explore and fixed is None and self._probe_could_pay(batch, fixed_rows)
            due = fixed is None and (explore or c.plan.probe_pending or (
                c.plan.plain_run >= c.plan.probe_interval and self._probe_could_pay(batch, fixed_rows)))
            probe = due and lag <= self.catch_up_limit
            n = min(c.room, fixed if fixed is not None else f + self.gamma_max) - f
            in_step = IN_STEP_LAG_CONSTRAINED if c.constrained else IN_STEP_LAG
            if n > 0 and (lag <= in_step or (lag <= self.catch_up_limit and (fixed is not None or probe))):
                # The first pass that drafts takes in every token the draft lacks (and the
                # forced ones): the plan is charged for them (a few after drafting steps;
                # longer lags are judged in _catch_up).
                options.append(DraftOption(MODEL, forced + self._alphas(c).row_alphas(n), costly=True,
                                           catch_up=lag + f, free=f))
            elif n > 0:  # its draft catches up first (and then it probes, when one is due)
                d.lagging = True
                d.explore, d.probe_due = explore, due
        if f:
            options.append(DraftOption(FORCED, forced, costly=False, catch_up=0))
        if not options:
            return PlanRequest(fixed=fixed)
        if fixed is not None:
            return PlanRequest(options=options, fixed=fixed)
        model = [o for o in options if o.route == MODEL]
        if model and probe:
            d.probe, d.explore = True, explore  # α̂ may be stale (or a guess): measure it
            return PlanRequest(options=model, fixed=min(f + PROBE_GAMMA, len(model[0].row_alphas)))
        return PlanRequest(options=options)

    def _catch_up(self, cands: Sequence[Candidate], decisions: list[Decision], plans: list[PlanRequest],
                  lagging: list[int], fixed_rows: int, joining: int, budget: int) -> bool:
        """Set the catch-up chunks worth their cost this step; True if any.

        Catching up L tokens costs draft passes over L rows, once; drafting
        then saves (1/r₀ − 1/r₁) per token of the batch while the sequence
        lives, r₀ and r₁ the planned rates without and with its model drafts
        (over its remaining tokens, at most EXPECTED_TOKENS in a batch and
        EXPECTED_TOKENS_ALONE alone, times the batch size); the cost is that
        of chunks of ``budget`` rows.  A sequence catches up when r₁ beats r₀
        by INVESTMENT_GAIN and the saving repays the cost CATCH_UP_PAYBACK
        times, judged again every step, and only where drafting has paid for
        its catch-ups so far at this batch size (``BatchPlanner.may_invest``);
        a fixed γ and the exploring sequence always do.  Nobody else does
        while others are joining: the batch is about to grow.
        """
        n, chunk_rows = len(cands), budget
        hold = joining > 0 or not self.planner.may_invest(n)
        # The exploring sequence catches up without a payback test: what it
        # measures every later plan uses.
        forced = [i for i in lagging if decisions[i].explore]
        if hold and not forced and not any(isinstance(cands[i].gamma, int) for i in lagging):
            return False
        r0 = self.planner.last_rate
        hypothetical = list(plans)
        for i in lagging:
            c = cands[i]
            rows = max(1, min(c.room, self.gamma_max))
            # A probe falls due because α̂ is stale: its catch-up is judged at an
            # acceptance as good as drafts get, the rest at their α̂.
            alphas = [OPTIMISTIC_ALPHA] * rows if decisions[i].probe_due else self._alphas(c).row_alphas(rows)
            model = DraftOption(MODEL, alphas, costly=True, catch_up=CAUGHT_UP_LAG)
            hypothetical[i] = PlanRequest(options=[*plans[i].options, model], fixed=plans[i].fixed)
        alt = self.planner.plan(hypothetical, fixed_rows)
        r1 = self.planner.last_rate
        drafting = [i for i in lagging if alt[i][0] == MODEL and alt[i][1] > 0]
        pays = bool(drafting) and r0 > 0 and r1 > INVESTMENT_GAIN * r0
        saving_per_token = (1.0 / r0 - 1.0 / r1) / len(drafting) if pays else 0.0
        drafting += [i for i in forced if i not in drafting]
        any_chunk = False
        for i in drafting:
            c = cands[i]
            assert c.draft_lag is not None  # a lagging sequence's lag is measured: it has a draft model
            lag = c.draft_lag - 1
            if budget <= 0:
                break
            if not isinstance(c.gamma, int) and i not in forced:
                if hold:
                    continue
                remaining = min(c.remaining, EXPECTED_TOKENS_ALONE if n == 1 else EXPECTED_TOKENS)
                chunk = min(lag, chunk_rows)
                cost = self.planner.draft.time(chunk) * math.ceil(lag / chunk)
                if remaining * n * saving_per_token < CATCH_UP_PAYBACK * cost:
                    continue
            take = min(lag, budget)
            decisions[i].catch_up = take
            if decisions[i].probe_due:
                c.plan.probe_pending = True  # what was spent to probe is not wasted by a later veto
            budget -= take
            any_chunk = True
        self.catch_up_gain = r1 / r0 if any_chunk and r0 > 0 else 0.0
        return any_chunk

    def _alphas(self, c: Candidate) -> AlphaTracker:
        """The sequence's own acceptance once it has drafted, the pair's until then."""
        return c.plan.alpha if c.plan.alpha.first_rows else self.pair_alpha

    def _explorer(self, cands: Sequence[Candidate]) -> Optional[int]:
        """The sequence that probes the draft model now because the pair's
        acceptance is still (mostly) the guess (the first one that may
        draft), or None."""
        if not self.has_draft or self.alpha_known or self.pair_alpha.first_rows >= EXPLORE_ROWS:
            return None
        return next((i for i, c in enumerate(cands) if not isinstance(c.gamma, int)), None)

    def _probe_could_pay(self, batch: int, fixed_rows: int) -> bool:
        """Whether drafting could pay in this batch even at an acceptance as
        good as drafts get (judged at the steady state: the catch-up a probe
        needs is a one-off), and drafting has not yet failed to repay what
        it cost at this batch size."""
        return self.planner.may_invest(batch) and self.planner.drafting_could_pay(
            batch, PROBE_GAMMA, CAUGHT_UP_LAG, OPTIMISTIC_ALPHA, fixed_rows, margin=INVESTMENT_GAIN)

    # ------------------------------------------------------------ feedback
    def learn(self, c: Candidate, d: Decision, route: Optional[str], alphas: Sequence[float],
              first_token: Optional[int]) -> None:
        """Feed one verified step of ``c`` (planned as ``d``, drafted through
        ``route``, which an empty or failed draft turns to None; ``alphas``
        of the verified rows the draft sampled, forced rows left out since
        their α = 1 would inflate α̂; ``first_token``: the
        token emitted after the forced ones, if any) to the acceptance
        estimates."""
        plan = c.plan
        rows = [float(a) for a in alphas]
        if route == MODEL:
            plan.probe_pending = False
            if d.probe:  # would drafting pay at what the probe found? Then probe again soon
                found = sum(rows) / len(rows) if rows else 0.0
                paid = self.planner.drafting_could_pay(d.batch, PROBE_GAMMA, CAUGHT_UP_LAG, found, margin=1.0)
                plan.probe_interval = self.probe_every if paid else min(2 * plan.probe_interval, self.probe_max)
            plan.alpha.observe(rows)
            self.pair_alpha.observe(rows)
            plan.plain_run = 0
        elif self.has_draft and c.gamma != 0:
            plan.plain_run += 1  # the model's α̂ of this sequence ages
            plan.alpha.stale += 1
        m = d.match
        if route == NGRAM:
            self.match_alphas.record_rows(m.length, m.unanimous, rows)
        elif m is not None and first_token is not None:  # the lookup predicted a token it did not draft: was it right?
            self.match_alphas.record_prediction(m.length, m.unanimous, int(first_token) == int(m.token))

    def observe_target(self, rows: int, seconds: float) -> None:
        """A target pass over ``rows`` rows took ``seconds``."""
        self.planner.observe_target(rows, seconds)

    def observe_draft(self, rows: int, seconds: float) -> None:
        """A draft pass over ``rows`` rows took ``seconds``."""
        self.planner.observe_draft(rows, seconds)

    def observe_step(self, batch: int, drafting: bool, caught_up: bool, explored: bool, planned_rate: float,
                     emitted: int, seconds: float) -> None:
        """A step of ``batch`` decoding sequences and no prompt rows (which
        drafted, caught a draft up, or had an exploring probe) emitted
        ``emitted`` tokens in ``seconds``: scored against its plan unless it
        caught up (a cost the plan sets aside), and in the drafting ledger
        (catch-ups included) unless it explored: that probe buys what every
        later plan knows."""
        if batch < 1:
            return
        if not caught_up:
            self.planner.observe_step(batch, drafting, planned_rate, emitted, seconds)
        if not explored:
            self.planner.observe_balance(batch, drafting or caught_up, emitted, seconds)

    def verify_rows_untimed(self) -> int:
        """Rows of the longest verify pass while the target's time for that
        many rows is not settled (else 0): the loop then takes in the last
        rows of a γ=auto sequence's prompt as a pass of their own.  The
        prompt's first pass may be a process's first, cold (weights not yet
        in the page cache, a first call's setup: one 56-row pass took 2.5 s
        against 0.44 s warm), and a verify read off its slope would never
        look worth drafting; a pass the size drafting uses, run warm, times
        what every plan compares (docs/planning.md §4)."""
        rows = min(self.gamma_max + 1, self.planner.max_rows)
        return 0 if rows < 2 or self.planner.target.settled(rows) else rows

    def draft_unmeasured(self) -> bool:
        """Whether the draft model's one-row pass time is not settled (no
        calibration, fewer than two readings: the first may be cold): the
        loop then times a draft row in a step that does not draft."""
        return self.has_draft and not self.planner.draft.settled(1)

    def estimates(self) -> dict:
        """α̂ of the pair and the pass-time curves, as plain data (statistics, logs)."""
        t = self.planner.target.curve_list()
        d = self.planner.draft.curve_list() if self.planner.draft.measured else []
        return {
            "alpha": self.pair_alpha.first,
            "alpha_rest": self.pair_alpha.rest,
            "alpha_measured": self.alpha_known or self.pair_alpha.first_rows > 0,
            "target_ms": [float(x) for x in t[1:]],
            "draft_ms": [float(x) for x in d[1:]],
            "cost": float(d[1] / t[1]) if d and t[1] > 0 else None,
        }
