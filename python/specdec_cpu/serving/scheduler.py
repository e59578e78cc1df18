"""The batched decoder's scheduler: one thread running steps over all requests.

One step (docs/serving.md §3):

1. end requests that were cancelled, timed out or closed; admit waiting
   requests into free slots (prompt-prefix reuse, see slots.py);
2. choose every decoding request's draft route and γ (planning/batch_planner.py);
3. draft: one draft-model pass per depth for all requests drafting that deep
   (prompt chunks of new requests ride in the first); n-gram drafts are free;
4. ONE target pass: every decoding request's last token and γ drafts, and
   prompt chunks of requests still being prefilled, within the per-step
   prompt budget so a long prompt never stalls the others for long;
5. per request: the exact verify with its own parameters and random
   streams, its own KV roll-back, its text delivered as it comes.

One request's failure (NaN logits, a cancel) ends that request only.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import sampling
from ..drafters import NgramDrafter
from ..drafters.unwrap import unwrapped_reference
from ..drafters.vocab_map import DraftVocab
from ..engine.multi_context import LlamaMultiContext, Rows
from ..engine.openmp import release_threads
from ..errors import DecoderClosedError, InvalidLogitsError, QueueFullError, SpecDecError
from ..model import Tokenizer, eog_id_array
from ..planning.batch_planner import AlphaTracker, BatchPlanner, DraftOption, PlanRequest
from ..planning.match_controller import MatchAlphas
from .metrics import ServingMetrics
from .request import Request
from .slots import SlotTable
from .step_trace import StepRecord, StepTrace

__all__ = ["Scheduler"]

log = logging.getLogger("specdec_cpu.serving")

#: A draft cache lagging by at most IN_STEP_LAG tokens (as after a drafting
#: step) takes them in within the step's first draft pass, charged to the
#: plan.  Further behind (after a prompt, or plain or lookup steps), it first
#: catches up in prompt-sized chunks, when that pays (``Scheduler._catch_up``);
#: only a probe or a request with a fixed γ takes in up to CATCH_UP_LIMIT
#: tokens within its drafting step.
IN_STEP_LAG = 4
CATCH_UP_LIMIT = 64
#: ... and only when the drafting it enables saves this many times its cost
#: over the request's remaining tokens, at most EXPECTED_TOKENS of them: a
#: drafting stretch in a shared batch is short (an arrival, a finish or a dip
#: of α̂ ends it).  Traced at four requests (staggered and burst arrivals,
#: 24 blocks), a horizon of 256 tokens made catch-ups that cost the batch
#: 1.5× what the drafting they enabled gained (252 tokens' worth of time
#: against 165); 64 asks a catch-up to pay within about one stretch.
CATCH_UP_PAYBACK = 1.5
EXPECTED_TOKENS = 64
#: A catch-up or a probe is an investment made on a predicted gain: it is made
#: only when drafting is predicted to beat plain batching by this factor (a
#: margin for the cost model's error: traced step rates of drafting batches came
#: out 0–10% below prediction).  A marginal prediction would spend a catch-up
#: of tens of draft rows on drafts that do not pay.
INVESTMENT_GAIN = 1.05
#: The draft's lag after catching up, as the plan charges it: the step's own token.
CAUGHT_UP_LAG = 2
#: A probe (a request re-measuring its draft's acceptance after a plain
#: stretch) drafts this many tokens, and happens only if it could pay at
#: an acceptance of OPTIMISTIC_ALPHA.
PROBE_GAMMA = 2
OPTIMISTIC_ALPHA = 0.95
#: The pair's acceptance before anything is measured.  While it is only this
#: guess, the first request that could draft probes at its first decoding
#: step: planned at 0.7, drafting at two requests looks no better than plain
#: batching for the default pair (0.92 measured), and the first requests of a
#: fresh decoder ran plain for 32 steps before their first probe.
ALPHA_GUESS = 0.7
MODEL, NGRAM = "model", "ngram"


@dataclass
class _Work:
    """What one decoding request does in the current step."""

    req: Request
    route: Optional[str] = None
    gamma: int = 0
    tokens: Optional[np.ndarray] = None  # the draft
    probs: Optional[np.ndarray] = None  # its q rows (model route)
    match: Optional[object] = None  # the n-gram match offered this step
    probe: bool = False
    explore: bool = False  # a probe because the pair's acceptance is still the guess
    draft_seconds: float = 0.0
    # for a step trace: the α̂ its draft was planned with, and what the verify found
    alpha_hat: tuple = ()
    alphas: tuple = ()
    accepted: int = 0


class Scheduler:
    """Runs the steps of a :class:`~specdec_cpu.serving.BatchedDecoder`.

    Requests enter with :meth:`submit` (any thread); the scheduler thread
    owns the contexts, the slots and every request's state from then on.
    """

    def __init__(self, *, target: LlamaMultiContext, draft: Optional[LlamaMultiContext], tokenizer: Tokenizer,
                 planner: BatchPlanner, metrics: ServingMetrics, max_queue: int, prefill_chunk: int,
                 gamma_max: int, ngram_kwargs: Optional[dict], alpha_prior: Optional[float] = None,
                 probe_every: int = 32, probe_max: int = 256, step_trace: Optional[StepTrace] = None) -> None:
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.planner, self.metrics = planner, metrics
        self.max_queue, self.prefill_chunk, self.gamma_max = max_queue, prefill_chunk, gamma_max
        self.ngram_kwargs = ngram_kwargs
        self.match_alphas = MatchAlphas() if ngram_kwargs is not None else None
        # The pair's acceptance: measured by a calibration, or a guess that the
        # first rows drafted replace (a guess counts as one row) and that a
        # request explores before anyone relies on it (_explorer).
        self.alpha_known = alpha_prior is not None
        prior = ALPHA_GUESS if alpha_prior is None else alpha_prior
        self.pair_alpha = AlphaTracker(first=prior, rest=prior, ema=0.05, prior_rows=20.0 if self.alpha_known else 1.0)
        self.probe_every, self.probe_max = probe_every, probe_max
        self.step_trace = step_trace
        self._passes: Optional[tuple[list, list]] = None  # (target, draft) passes of a traced step
        self._catch_up_gain = 0.0  # the predicted gain this step's catch-up was made on (for the trace)
        self.slots = SlotTable(target, draft)
        self._eog: Optional[np.ndarray] = None  # the target's end-of-generation ids, once a request bans them
        self.draft_vocab = (DraftVocab(draft.n_vocab, target.n_vocab, draft.weights.source_ids)
                            if draft is not None else None)
        self._cond = threading.Condition()
        self._waiting: "collections.deque[Request]" = collections.deque()
        self._active: list[Request] = []
        self._closed = False  # no more submissions
        self._failed: Optional[str] = None  # why the scheduler stopped, if it failed
        self._abort = False  # end everything in flight now
        self._thread = threading.Thread(target=self._loop, name="specdec-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ any thread
    def submit(self, req: Request) -> None:
        """Queue a request (FIFO); ``QueueFullError`` when ``max_queue`` wait already."""
        with self._cond:
            if self._closed:
                raise DecoderClosedError(self._failed or "BatchedDecoder is closed")
            if len(self._waiting) - self.slots.n_free >= self.max_queue:
                self.metrics.count_request("rejected")
                raise QueueFullError(
                    f"{len(self._waiting)} requests are already waiting (max_queue={self.max_queue}); "
                    "retry later", waiting=len(self._waiting))
            self._waiting.append(req)
            self.metrics.queue_depth = len(self._waiting)
            self._cond.notify()

    def close(self, *, drain: bool, timeout: Optional[float]) -> None:
        """Stop taking requests; with ``drain`` let those in flight finish
        (up to ``timeout`` seconds), then end whatever is left and stop."""
        with self._cond:
            self._closed = True
            if not drain:
                self._abort = True
            self._cond.notify()
        if drain:
            self._thread.join(timeout)
            with self._cond:
                self._abort = True
                self._cond.notify()
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._abort:
                        break
                    idle = not self._active and not self._waiting
                    if idle and self._closed:
                        break
                if idle:
                    # Idle, this thread keeps no OpenMP workers: they would slow every
                    # other decoder's passes in the process (engine/openmp.py).
                    release_threads()
                    with self._cond:
                        while not (self._active or self._waiting or self._closed or self._abort):
                            self._cond.wait()
                    continue
                self._step()
        except BaseException as exc:  # a bug or a dead model: nobody may hang on us
            log.exception("batched decoder scheduler failed")
            self._fail_all(f"the batched decoder's scheduler failed: {exc!r}")
            return
        self._fail_all(None)

    def _fail_all(self, failure: Optional[str]) -> None:
        """End every request in flight: with a SpecDecError carrying
        ``failure`` if the scheduler failed, else (a close) with a
        DecoderClosedError carrying what each request had produced."""
        with self._cond:  # closed in the same breath: no submission can slip in after
            self._closed = True
            self._failed = failure and f"{failure}; the decoder takes no more requests"
            pending = list(self._waiting) + list(self._active)
            self._waiting.clear()
        for req in pending:  # an error object of its own for each caller's traceback
            err = SpecDecError(failure) if failure else DecoderClosedError(
                f"the decoder was closed while request {req.id} was "
                f"{'running' if req.slot is not None else 'waiting'}")
            self._end(req, "cancelled", err)
        self._active.clear()
        self._publish_gauges()

    # ------------------------------------------------------------ one step
    def _step(self) -> None:
        t_step = time.perf_counter()
        self._stop_requests(t_step)
        self._admit()
        if not self._active:
            return
        decoding = [r for r in self._active if r.prefilled]
        target_parts = self._prefill_parts(has_decoders=bool(decoding))
        work, draft_parts = self._plan(decoding, target_parts)
        planned_rate = self.planner.last_rate
        if self.step_trace is not None:
            self._passes = ([], [])
        self._draft(work, draft_parts)
        emitted = self._target_and_verify(work, target_parts)
        if work and not target_parts:
            seconds = time.perf_counter() - t_step
            drafting = any(w.gamma > 0 for w in work)
            if not draft_parts:
                # A step of decoding alone (no prompt, no draft catching up, whose
                # costs the plan sets aside): score it against its plan.
                self.planner.observe_step(len(work), drafting, planned_rate, emitted, seconds)
            # The ledger counts the catch-up too: it is what drafting cost here.  Not an
            # exploring probe's: it buys what every later plan knows, at any batch size.
            if not any(w.explore for w in work):
                self.planner.observe_balance(len(work), drafting or bool(draft_parts), emitted, seconds)
        self._finish_step(t_step, emitted)
        if self.step_trace is not None:
            self._trace(t_step, work, target_parts, draft_parts, planned_rate, emitted)

    def _stop_requests(self, now: float) -> None:
        for req in list(self._active):
            reason = req.stop_reason(now)
            if reason is not None:
                self._end(req, reason)
        with self._cond:
            for req in list(self._waiting):
                reason = req.stop_reason(now)
                if reason is not None:
                    self._waiting.remove(req)
                    self._end(req, reason)

    def _admit(self) -> None:
        while self.slots.n_free:
            with self._cond:
                if not self._waiting:
                    break
                req = self._waiting.popleft()
            try:
                self._admit_one(req)
            except Exception as exc:  # it alone fails; an uncaught error here would leave its caller waiting
                log.exception("admitting request %d failed", req.id)
                self._end(req, None, SpecDecError(f"request {req.id} could not start: {exc!r}"))
        self._publish_gauges()

    def _admit_one(self, req: Request) -> None:
        """Give ``req`` a sequence (its cached prompt prefix reused) and its
        acceptance estimates, and make it active."""
        claim = self.slots.claim(req.prompt)
        req.slot = claim.slot
        req.admitted = time.perf_counter()
        req.stats.queue_seconds = req.admitted - req.submitted
        req.stats.prompt_cached = claim.target_cached
        with self.metrics.lock():
            self.metrics.prompt_tokens += len(req.prompt)
            self.metrics.prompt_tokens_cached += claim.target_cached
            self.metrics.prefix_cache_hits += claim.target_cached > 0
        # Seeded by the pair: as two rows where the pair's α was measured, as one while it is the guess.
        measured = self.alpha_known or self.pair_alpha.first_rows > 0
        req.alpha = AlphaTracker(first=self.pair_alpha.first, rest=self.pair_alpha.rest,
                                 prior_rows=2.0 if measured else 1.0)
        req.probe_interval = self.probe_every
        if self.ngram_kwargs is not None and req.gamma != 0:
            req.ngram = NgramDrafter(**self.ngram_kwargs)
        self._active.append(req)
        self._check_prefilled(req)

    def _prefill_parts(self, has_decoders: bool) -> list[Rows]:
        """Prompt chunks of the requests still being prefilled, within this
        step's prompt budget (small while other requests are decoding, so
        their next tokens are not held up; the whole batch when alone)."""
        budget = self.prefill_chunk if has_decoders else self.target.n_batch
        budget = min(budget, self.target.n_batch - len(self._active))
        parts: list[Rows] = []
        for req in self._active:
            if req.prefilled or budget <= 0:
                continue
            have = self.target.n_past(req.slot)
            n = min(len(req.seq) - have, budget)
            if n > 0:
                # The chunk that ends the prompt also asks for the last row's
                # logits: the first token is sampled from the prompt's own pass
                # (one pass less before the first token than a decoding step).
                last = have + n == len(req.seq)
                parts.append(Rows(req.slot, req.seq[have:have + n], 1 if last else 0))
                budget -= n
        return parts

    # ------------------------------------------------------------ planning
    def _plan(self, decoding: list[Request], target_parts: list[Rows]) -> tuple[list[_Work], list[Rows]]:
        """Every decoding request's (route, γ), and the draft model's catch-up
        chunks of this step.

        The draft model takes in a request's text lazily: a prompt (or a
        stretch of plain or lookup steps) leaves its cache behind, and
        catching up costs draft passes that pay only if the request then
        drafts with the model.  So a request whose draft lags by more than
        IN_STEP_LAG tokens is planned as it is (no model route), and
        planned again as if caught up: when that plan drafts for it with the
        model and the saving repays the catch-up (see ``_catch_up``), its
        draft catches up in prompt-sized chunks.  (At a full batch the rows
        are not free, γ goes to 0, and no request pays for a draft it would
        not use.)
        """
        work = [_Work(r) for r in decoding]
        fixed_rows = sum(len(p.tokens) for p in target_parts)
        lagging: dict[int, int] = {}  # index in work -> tokens its draft lacks
        explorer = self._explorer(work)
        plans = [self._options(w, i, lagging, len(work), fixed_rows, explore=w is explorer)
                 for i, w in enumerate(work)]
        choice = self.planner.plan(plans, fixed_rows)
        rate = self.planner.last_rate
        self._catch_up_gain = 0.0
        catch_up = self._catch_up(work, plans, lagging, fixed_rows) if lagging else []
        if catch_up:  # plan again with the catch-up rows in the first draft pass
            choice = self.planner.plan(plans, fixed_rows, sum(len(p.tokens) for p in catch_up))
        else:
            self.planner.last_rate = rate  # the rate of the plan chosen, not of _catch_up's what-if
        for w, (route, g) in zip(work, choice):
            w.route, w.gamma = route, g
        if self.step_trace is not None:
            for w, plan in zip(work, plans):
                w.alpha_hat = next((tuple(o.row_alphas[:w.gamma]) for o in plan.options
                                    if o.route == w.route and w.gamma), ())
        return work, catch_up

    def _catch_up(self, work: list[_Work], plans: list[PlanRequest], lagging: dict[int, int],
                  fixed_rows: int) -> list[Rows]:
        """Draft catch-up chunks worth their cost this step.

        Catching up L tokens costs draft passes over L rows, once; drafting
        then saves (1/r₀ − 1/r₁) per token of the batch while the request
        lives, r₀ and r₁ the planned rates without and with its model drafts
        (the batch's tokens over its remaining life: about its remaining
        tokens, capped at EXPECTED_TOKENS, times the batch size).  A request
        catches up when r₁ beats r₀ by INVESTMENT_GAIN and the saving repays
        the cost CATCH_UP_PAYBACK times, judged again every step (a batch
        that fills up meanwhile stops a catch-up that no longer pays), and
        only where drafting has paid for its catch-ups so far at this batch
        size (``BatchPlanner.may_invest``); a request that asked for a fixed
        γ always does.  Nobody else does while
        other requests are taking in their prompt or waiting: the batch is
        about to grow, and the plan of the requests decoding now would invest
        in drafts a full batch does not use.
        """
        with self._cond:
            joining = len(self._active) - len(work) + len(self._waiting)
        # Only a request that asked for a fixed γ catches up where drafting has not
        # yet paid back its earlier catch-ups at this batch size (planning/ledger.py).
        hold = joining or not self.planner.may_invest(len(work))
        # So does the request exploring a pair nobody has measured (_explorer).
        if hold and not any(isinstance(work[i].req.gamma, int) or work[i].explore for i in lagging):
            return []
        r0 = self.planner.last_rate
        hypothetical = list(plans)
        for i in lagging:
            n = self._model_rows(work[i].req)
            model = DraftOption(MODEL, self._alphas(work[i].req).row_alphas(n), costly=True, catch_up=CAUGHT_UP_LAG)
            hypothetical[i] = PlanRequest(options=[*plans[i].options, model], fixed=plans[i].fixed)
        alt = self.planner.plan(hypothetical, fixed_rows)
        r1 = self.planner.last_rate
        drafting = [i for i in lagging if alt[i][0] == MODEL and alt[i][1] > 0]
        pays = drafting and r0 > 0 and r1 > INVESTMENT_GAIN * r0
        saving_per_token = (1.0 / r0 - 1.0 / r1) / len(drafting) if pays else 0.0
        drafting += [i for i in lagging if work[i].explore and i not in drafting]
        budget = min(self.prefill_chunk, self.draft.n_batch - len(work))
        parts: list[Rows] = []
        for i in drafting:
            req, lag = work[i].req, lagging[i]
            if budget <= 0:
                break
            if not isinstance(req.gamma, int) and not work[i].explore:
                if hold:
                    continue
                remaining = min(req.max_tokens - req.stats.tokens, self.target.n_ctx - len(req.seq),
                                EXPECTED_TOKENS)
                chunk = min(lag, self.prefill_chunk)
                cost = self.planner.draft.time(chunk) * math.ceil(lag / chunk)
                if remaining * len(work) * saving_per_token < CATCH_UP_PAYBACK * cost:
                    continue
            have = self.draft.n_past(req.slot)
            n = min(lag, budget)
            parts.append(Rows(req.slot, req.seq[have:have + n]))
            budget -= n
        self._catch_up_gain = r1 / r0 if parts and r0 > 0 else 0.0
        return parts

    def _alphas(self, req: Request) -> AlphaTracker:
        """The request's own acceptance once it has drafted, the pair's until then."""
        return req.alpha if req.alpha.first_rows else self.pair_alpha

    def _model_rows(self, req: Request) -> int:
        room = self.target.n_ctx - len(req.seq)
        return max(1, min(req.max_tokens - req.stats.tokens - 1, room, self.gamma_max))

    def _explorer(self, work: list[_Work]) -> Optional[_Work]:
        """The request that probes the draft model now because the pair's
        acceptance is still the guess (the first one that may draft), or None.
        Its draft catches up first where the lag is too long for one step."""
        if self.draft is None or self.alpha_known or self.pair_alpha.first_rows:
            return None
        return next((w for w in work if not isinstance(w.req.gamma, int)), None)

    def _options(self, w: _Work, index: int, lagging: dict[int, int], batch: int, fixed_rows: int,
                 explore: bool = False) -> PlanRequest:
        req = w.req
        room = self.target.n_ctx - len(req.seq)
        cap = max(0, min(req.max_tokens - req.stats.tokens - 1, room))
        if req.gamma == 0 or cap == 0:
            return PlanRequest()
        options = []
        if req.ngram is not None:
            m = req.ngram.match(req.seq)
            if m is not None:
                w.match = m
                n = min(cap, req.ngram.max_draft)
                options.append(DraftOption(NGRAM, self.match_alphas.row_alphas(m.length, m.unanimous, n),
                                           costly=False, catch_up=0))
        fixed = req.gamma if isinstance(req.gamma, int) else None
        probe = False
        if self.draft is not None:
            lag = len(req.seq) - self.draft.n_past(req.slot)  # the last token included
            explore = explore and fixed is None and self._probe_could_pay(batch, fixed_rows)
            probe = fixed is None and lag <= CATCH_UP_LIMIT and (
                explore or (req.plain_run >= req.probe_interval and self._probe_could_pay(batch, fixed_rows)))
            if lag <= IN_STEP_LAG or (lag <= CATCH_UP_LIMIT and (fixed is not None or probe)):
                n = min(cap, self.gamma_max)
                # The first pass that drafts takes in every token the draft lacks: the plan is
                # charged for them (a few after drafting steps; after plain steps, the
                # catch-up is judged on its own in _catch_up).
                options.append(DraftOption(MODEL, self._alphas(req).row_alphas(n), costly=True, catch_up=lag))
            else:
                lagging[index] = lag - 1
                w.explore = explore  # its draft catches up, then it probes
        if not options:
            return PlanRequest(fixed=fixed)
        if fixed is not None:
            return PlanRequest(options=options, fixed=fixed)
        model = [o for o in options if o.route == MODEL]
        if model and probe:
            w.probe = True  # α̂ may be stale after a plain stretch (or a guess): measure it
            w.explore = explore
            return PlanRequest(options=model, fixed=min(PROBE_GAMMA, len(model[0].row_alphas)))
        return PlanRequest(options=options)

    def _probe_could_pay(self, batch: int, fixed_rows: int) -> bool:
        """Whether drafting could pay in this batch even at an acceptance as good
        as drafts get (judged at the steady state: the catch-up a probe needs is
        a one-off).  At a full batch the rows are not free and no acceptance
        repays the draft passes: a probe there would spend a draft pass over
        every token the draft missed to measure an α̂ no plan uses.  Nor where
        drafting has not yet paid back what it cost at this batch size."""
        return self.planner.may_invest(batch) and self.planner.drafting_could_pay(
            batch, PROBE_GAMMA, CAUGHT_UP_LAG, OPTIMISTIC_ALPHA, fixed_rows, margin=INVESTMENT_GAIN)

    # ------------------------------------------------------------ drafting
    def _draft(self, work: list[_Work], prefill: list[Rows]) -> None:
        """Draft for every request of ``work`` (n-gram lookups, then one
        draft-model pass per depth) and run the draft's prompt chunks."""
        for w in work:
            if w.route == NGRAM and w.gamma > 0:
                d = w.req.ngram.propose(w.req.seq, w.gamma, w.req.params, w.req.rng_draft)
                w.gamma = min(w.gamma, len(d))
                w.tokens, w.probs = d.tokens[:w.gamma], None
                if w.gamma == 0:
                    w.route = None
        drafting = [w for w in work if w.route == MODEL and w.gamma > 0]
        if self.draft is None or (not drafting and not prefill):
            return
        for w in drafting:
            w.tokens = np.zeros(w.gamma, dtype=np.int32)
            w.probs = w.req.q_rows(w.gamma)
        depth = 0
        while True:
            live = [w for w in drafting if w.gamma > depth and not w.req.finished]
            parts = list(prefill) if depth == 0 else []
            for w in live:
                seq = w.req.seq
                toks = seq[self.draft.n_past(w.req.slot):] if depth == 0 else [int(w.tokens[depth - 1])]
                parts.append(Rows(w.req.slot, toks, 1))
            if not parts:
                break
            t0 = time.perf_counter()
            try:
                rows = self.draft.decode(parts)
            except SpecDecError as exc:  # the draft failed: these requests take a plain step
                log.warning("draft pass failed (%s); %d requests step without a draft", exc, len(live))
                for w in live:
                    w.route, w.gamma, w.tokens, w.probs = None, 0, None, None
                break
            dt = time.perf_counter() - t0
            n_rows = sum(len(p.tokens) for p in parts)
            if self._passes is not None:
                self._passes[1].append((n_rows, 1000.0 * dt, self.planner.draft.time(n_rows)))
            self.planner.observe_draft(n_rows, dt)
            with self.metrics.lock():
                self.metrics.draft_passes += 1
                self.metrics.draft_rows += sum(len(p.tokens) for p in parts)
                self.metrics.draft_seconds += dt
            for w, r in zip(live, rows[len(parts) - len(live):]):
                w.draft_seconds += dt
                req = w.req
                try:
                    w.tokens[depth] = self.draft_vocab.sample_into(r.view()[0], req.params, req.rng_draft,
                                                                   w.probs[depth])
                except InvalidLogitsError as exc:
                    self._end(req, None, InvalidLogitsError(
                        f"the draft model produced invalid logits for request {req.id} drafting from "
                        f"position {len(req.seq)}: {exc}"))
                except Exception as exc:  # a fault of this request's draft: it alone fails
                    log.exception("drafting for request %d failed", req.id)
                    self._end(req, None, SpecDecError(f"request {req.id} failed while drafting: {exc}"))
            depth += 1
            if not live:
                break
        for w in drafting:
            if w.req.finished:
                w.route, w.gamma = None, 0

    # ------------------------------------------------------------ the target pass
    def _target_and_verify(self, work: list[_Work], prefill: list[Rows]) -> int:
        """One target pass over every request's rows, then each request's
        verify, roll-back and delivery.  Returns the tokens emitted."""
        work = [w for w in work if not w.req.finished]
        parts = list(prefill)
        for w in work:
            toks = [w.req.seq[-1]] + (w.tokens[:w.gamma].tolist() if w.gamma else [])
            parts.append(Rows(w.req.slot, toks, w.gamma + 1))
        if not parts:
            return 0
        n_rows = sum(len(p.tokens) for p in parts)
        t0 = time.perf_counter()
        try:
            rows = self.target.decode(parts)
        except SpecDecError as exc:  # nothing changed in the caches; these requests fail
            log.error("target pass over %d rows failed: %s", n_rows, exc)
            for p in parts:
                req = self._request_in(p.seq)
                if req is not None:
                    self._end(req, None, exc)
            return 0
        dt = time.perf_counter() - t0
        if self._passes is not None:
            self._passes[0].append((n_rows, 1000.0 * dt, self.planner.target.time(n_rows)))
        self.planner.observe_target(n_rows, dt)
        with self.metrics.lock():
            self.metrics.target_passes += 1
            self.metrics.target_rows += n_rows
            self.metrics.target_seconds += dt
        emitted = 0
        for part, r in zip(prefill, rows):
            if r is not None:
                emitted += self._first_token(part, r, dt)
        for w, r in zip(work, rows[len(prefill):]):
            emitted += self._verify(w, r, dt)
        return emitted

    def _first_token(self, part: Rows, rows, target_seconds: float) -> int:
        """The request's prompt is in: sample its first token from the
        prompt's last row (a plain step) and start decoding."""
        req = self._request_in(part.seq)
        if req is None or req.finished:
            return 0
        self._start_decoding(req)
        t0 = time.perf_counter()
        self._ban_eog(req, rows)
        try:
            token = sampling.sample(rows.view()[0], req.params, req.rng_verify)
        except InvalidLogitsError as exc:
            self._end(req, None, InvalidLogitsError(
                f"the target model produced invalid logits for request {req.id} at the end of its prompt "
                f"(position {len(req.seq) - 1}): {exc}"))
            return 0
        except Exception as exc:  # a fault of this request's sampling: it alone fails
            log.exception("sampling the first token of request %d failed", req.id)
            self._end(req, None, SpecDecError(f"request {req.id} failed at its first token: {exc!r}"))
            return 0
        stats = req.stats
        stats.steps += 1
        stats.gammas.append(0)
        stats.target_seconds += target_seconds
        stats.sampling_seconds += time.perf_counter() - t0
        return self._emit(req, [token])

    def _verify(self, w: _Work, rows, target_seconds: float) -> int:
        req = w.req
        stats = req.stats
        n_old = len(req.seq)
        t0 = time.perf_counter()
        self._ban_eog(req, rows)
        try:
            if w.gamma == 0:
                new = [sampling.sample(rows.view()[0], req.params, req.rng_verify)]
                n_acc, alphas = 0, ()
            else:
                res = sampling.verify_pointer(rows.address, w.gamma + 1, rows.n_vocab, w.tokens[:w.gamma],
                                              None if w.probs is None else w.probs[:w.gamma],
                                              req.params, req.rng_verify)
                n_acc, alphas = res.n_accepted, res.alphas
                new = w.tokens[:n_acc].tolist() + [res.token]
        except InvalidLogitsError as exc:
            self._end(req, None, InvalidLogitsError(
                f"the target model produced invalid logits for request {req.id} at positions {n_old - 1} on "
                f"(row r predicts position {n_old} + r): {exc}"))
            return 0
        except Exception as exc:  # a fault of this request's step: it alone fails
            log.exception("verify of request %d failed", req.id)
            self._end(req, None, SpecDecError(f"request {req.id} failed in its verify step: {exc}"))
            return 0
        t_sample = time.perf_counter() - t0
        # Every cache keeps only a prefix of the sequence: rejected drafts go,
        # and so do draft tokens of a step whose draft was abandoned.
        self.target.truncate(req.slot, n_old + n_acc)
        if self.draft is not None:
            self.draft.truncate(req.slot, min(self.draft.n_past(req.slot), n_old + n_acc))
        if req.ngram is not None:
            req.ngram.rollback(n_old + n_acc)
        self._learn(w, alphas, n_acc, new[0])
        if self.step_trace is not None:
            w.alphas, w.accepted = tuple(float(a) for a in alphas), n_acc
        stats.steps += 1
        stats.gammas.append(w.gamma)
        stats.target_seconds += target_seconds
        stats.draft_seconds += w.draft_seconds
        stats.sampling_seconds += t_sample
        if w.gamma:
            stats.drafted += w.gamma
            stats.accepted += n_acc
            stats.alpha_sum += float(sum(alphas))
            stats.alpha_rows += len(alphas)
            stats.record_drafter(w.route, w.gamma, n_acc)
        with self.metrics.lock():
            self.metrics.sampling_seconds += t_sample
            if w.gamma:
                self.metrics.drafted += w.gamma
                self.metrics.accepted += n_acc
                self.metrics.alpha_sum += float(sum(alphas))
                self.metrics.alpha_rows += len(alphas)
        return self._emit(req, new)

    def _ban_eog(self, req: Request, rows) -> None:
        """A request with ``ignore_eos``: its target rows give the end-of-generation ids probability 0."""
        if req.params.ignore_eos:
            if self._eog is None:
                self._eog = eog_id_array(self.tokenizer, self.target.n_vocab)
            rows.mask_columns(self._eog)

    def _learn(self, w: _Work, alphas, n_acc: int, first: int) -> None:
        """Feed the step's outcome to the acceptance estimates."""
        req = w.req
        rows = [float(a) for a in alphas]
        if w.route == MODEL:
            if w.probe:  # did the probe find the draft better than α̂ said?
                paid = bool(rows) and float(np.mean(rows)) >= req.alpha.first - 0.05
                req.probe_interval = self.probe_every if paid else min(2 * req.probe_interval, self.probe_max)
            req.alpha.observe(rows)
            self.pair_alpha.observe(rows)
            req.plain_run = 0
        elif self.draft is not None and req.gamma != 0:
            req.plain_run += 1  # the model's α̂ of this request ages
            req.alpha.stale += 1
        if w.route == NGRAM:
            m = w.match
            self.match_alphas.record_rows(m.length, m.unanimous, rows)
        elif w.match is not None:
            m = w.match  # the lookup predicted a token it did not draft: was it right?
            self.match_alphas.record_prediction(m.length, m.unanimous, int(first) == int(m.token))

    def _emit(self, req: Request, new: list[int]) -> int:
        stats = req.stats
        n = 0
        for tok in new:
            if self.tokenizer.is_eog(tok):
                stats.finish_reason = "stop"
                break
            req.seq.append(tok)
            req.out.append(tok)
            stats.tokens += 1
            n += 1
            if stats.tokens == 1:
                self._record_ttft(req)
            req.deliver(req.text.feed(self.tokenizer.token_bytes(tok)))
            if req.text.stopped:
                stats.finish_reason = "stop"
                break
            if stats.tokens >= req.max_tokens:
                stats.finish_reason = "length"
                break
        if stats.finish_reason is None and len(req.seq) > self.target.n_ctx:
            stats.finish_reason = "context"
        if stats.finish_reason is not None:
            self._end(req, stats.finish_reason)  # rings
        else:
            req.ring()
        return n

    # ------------------------------------------------------------ bookkeeping
    def _record_ttft(self, req: Request) -> None:
        """Record the request's time to first token (submission to now)."""
        ttft = time.perf_counter() - req.submitted
        req.stats.first_token_seconds = ttft
        self.metrics.record_first_token(ttft)

    def _check_prefilled(self, req: Request) -> None:
        """A request admitted with all of its prompt but the last token cached
        decodes at once (its first step evaluates that token)."""
        if not req.prefilled and self.target.n_past(req.slot) >= len(req.seq) - 1:
            self._start_decoding(req)

    def _start_decoding(self, req: Request) -> None:
        req.prefilled = True
        req.stats.prompt_seconds = time.perf_counter() - req.admitted
        if req.ngram is not None:
            if req.ngram.unwrap_lines:
                req.ngram.set_reference(unwrapped_reference(req.prompt, self.tokenizer))
            req.ngram.begin(req.seq)

    def _request_in(self, slot: int) -> Optional[Request]:
        for req in self._active:
            if req.slot == slot:
                return req
        return None

    def _end(self, req: Request, reason: Optional[str], error: Optional[BaseException] = None) -> None:
        """End a request: free its slot at once, count it, wake its caller."""
        if req.finished:
            return
        if req in self._active:
            self._active.remove(req)
        if req.slot is not None:
            if isinstance(error, InvalidLogitsError):  # its cells may hold NaN: reuse none of them
                self.target.clear(req.slot)
                if self.draft is not None:
                    self.draft.clear(req.slot)
            self.slots.release(req.slot)
        req.finish(reason, error)
        self.metrics.count_request("error" if error is not None and not isinstance(error, DecoderClosedError)
                                   else req.stats.finish_reason or "cancelled")

    def _trace(self, t_step: float, work: list[_Work], target_parts: list[Rows], draft_parts: list[Rows],
               planned_rate: float, emitted: int) -> None:
        """Hand the step's record to the step trace (a failing trace is dropped, not the decoder)."""
        prompt_rows = sum(len(p.tokens) for p in target_parts)
        passes, self._passes = self._passes or ([], []), None
        try:
            self.step_trace(StepRecord(
                start=t_step, seconds=time.perf_counter() - t_step,
                gammas=tuple(w.gamma for w in work), routes=tuple(w.route for w in work),
                probes=tuple(w.probe for w in work), alpha_hats=tuple(w.alpha_hat for w in work),
                alphas=tuple(w.alphas for w in work), accepted=tuple(w.accepted for w in work),
                prompt_rows=prompt_rows, catch_up_rows=sum(len(p.tokens) for p in draft_parts),
                catch_up_gain=self._catch_up_gain,
                planned_rate=planned_rate,
                plain_rate=self.planner.plain_rate(len(work), prompt_rows) if work else 0.0,
                emitted=emitted, target_passes=tuple(passes[0]), draft_passes=tuple(passes[1])))
        except Exception:
            log.exception("the step trace failed; tracing stops")
            self.step_trace = None

    def _finish_step(self, t_step: float, emitted: int) -> None:
        dt = time.perf_counter() - t_step
        with self.metrics.lock():
            self.metrics.steps += 1
            self.metrics.step_seconds += dt
            self.metrics.tokens_generated += emitted
            self.metrics.record_rate(emitted, dt)
        self._publish_gauges()

    def _publish_gauges(self) -> None:
        with self.metrics.lock():
            self.metrics.queue_depth = len(self._waiting)
            self.metrics.active_sequences = len(self._active)
