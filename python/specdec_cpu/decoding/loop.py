"""The step loop both decoders run: admission, prompt chunks, the plan, the step.

``StepLoop.step()`` runs one step over every active sequence
(docs/serving.md §3):

1. end sequences that were cancelled, timed out or closed;
2. choose the prompt chunks of sequences still taking in their prompt
   (within a budget while others decode, so a long prompt never stalls them);
3. ask the draft policy (planning/policy.py) for every decoding sequence's
   route and γ, and the draft catch-up chunks worth their cost;
4. run the step core (core/step.py): drafts, ONE target pass, each
   sequence's exact verify, roll-back and delivery;
5. feed what happened back to the policy, the metrics and the step trace.

``SpeculativeDecoder`` runs it on the caller's thread with one slot;
``BatchedDecoder``'s scheduler thread runs it with many.  Not thread-safe:
one thread drives a loop.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional
from typing import Sequence as Seq

from ..core.protocols import Rows, SequenceLM, Tokenizer
from ..core.sequence import Sequence
from ..core.step import StepCore, Work
from ..drafters import NgramDrafter
from ..drafters.unwrap import unwrapped_reference
from ..errors import DecoderClosedError, InvalidLogitsError, SpecDecError
from ..planning.policy import Candidate, DraftPolicy
from .metrics import ServingMetrics
from .slots import SlotTable
from .step_trace import StepRecord, StepTrace

__all__ = ["StepLoop"]

log = logging.getLogger("specdec_cpu.decoding")

#: The most prompt rows a step takes in for a request that asks for its prompt's
#: log-probabilities: each row's logits are kept (n_vocab floats per row).
PROMPT_LOGPROB_ROWS = 64


class StepLoop:
    """Sequences in the slots of a target (and draft) ``SequenceLM``, stepped together.

    Args:
        target, draft: the models (the same number of slots).
        tokenizer: the target's.
        policy: plans every step.
        prefill_chunk: prompt tokens a step takes in while others decode.
        ngram_kwargs: with prompt lookup, each sequence's ``NgramDrafter`` settings.
        metrics: counters to update.
        on_end: called with each sequence that ended (after its slot is free).
        draft_source_ids, names: as for :class:`~specdec_cpu.core.step.StepCore`.
    """

    def __init__(self, *, target: SequenceLM, draft: Optional[SequenceLM], tokenizer: Tokenizer,
                 policy: DraftPolicy, prefill_chunk: int, ngram_kwargs: Optional[dict],
                 metrics: ServingMetrics, on_end: Optional[Callable[[Sequence], None]] = None,
                 step_trace: Optional[StepTrace] = None, draft_source_ids=None,
                 names: tuple[str, str] = ("", ""), first_token_from_prompt: bool = True) -> None:
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        #: Whether a prompt's own pass yields the first token (one pass less
        #: before it), or the first decoding step does, as when the prompt was
        #: cached: then a seed gives the same tokens whatever the cache held.
        self.first_token_from_prompt = first_token_from_prompt
        self.policy, self.prefill_chunk, self.ngram_kwargs = policy, prefill_chunk, ngram_kwargs
        self.metrics, self.on_end, self.step_trace = metrics, on_end, step_trace
        self.slots = SlotTable(target, draft)
        self.active: list[Sequence] = []
        self.core = StepCore(target, draft, tokenizer, self, draft_source_ids=draft_source_ids, names=names)
        self._passes: Optional[tuple[list, list]] = None  # (target, draft) passes of a traced step

    # ------------------------------------------------------------ sequences
    @property
    def n_free(self) -> int:
        """Slots free for new sequences."""
        return self.slots.n_free

    def admit(self, seq: Sequence) -> None:
        """Give ``seq`` a slot (its cached prompt prefix reused) and its
        planning state, and make it active.  On an error ``seq`` is not
        active and holds no slot."""
        lead = seq.after
        shared = (seq.prompt_logprobs is not None and lead is not None and lead.prompt == seq.prompt
                  and lead.prompt_logprobs == seq.prompt_logprobs
                  and len(lead.prompt_entries) == len(seq.prompt) - 1)
        # A prompt's log-probabilities need its rows' logits: its cached prefix
        # is reused only when an earlier choice of the request computed them,
        # and its cells are all still there.
        claim = self.slots.claim(seq.prompt, reuse=seq.prompt_logprobs is None or shared)
        cached = claim.target_cached
        if seq.prompt_logprobs is not None:
            if shared and cached == len(seq.prompt) - 1:
                assert lead is not None
                seq.prompt_entries = list(lead.prompt_entries)
            elif cached:
                self.target.truncate(claim.slot, 0)
                cached = 0
        try:
            seq.slot = claim.slot
            seq.admitted = time.perf_counter()
            seq.stats.queue_seconds = seq.admitted - seq.submitted
            seq.stats.prompt_cached = cached
            seq.plan = self.policy.admit()
            if self.ngram_kwargs is not None and seq.gamma != 0:
                seq.ngram = NgramDrafter(**self.ngram_kwargs)
        except BaseException:
            self.slots.release(claim.slot)
            seq.slot = None
            raise
        with self.metrics.lock():
            self.metrics.prompt_tokens += len(seq.prompt)
            self.metrics.prompt_tokens_cached += cached
            self.metrics.prefix_cache_hits += cached > 0
        self.active.append(seq)
        if self.target.n_past(seq.slot) >= len(seq.seq) - 1:  # all but the last token cached
            self._start_decoding(seq)
            if seq.scored:  # a one-token prompt, or a choice sharing the first's: nothing to compute
                self.end(seq, "length")

    def end(self, seq: Sequence, reason: Optional[str], error: Optional[BaseException] = None) -> None:
        """End a sequence: free its slot at once, count it, tell ``on_end``."""
        if seq.finished:
            return
        if seq in self.active:
            self.active.remove(seq)
        if seq.slot is not None:
            if isinstance(error, InvalidLogitsError):  # its cells may hold NaN: reuse none of them
                self.target.clear(seq.slot)
                if self.draft is not None:
                    self.draft.clear(seq.slot)
            self.slots.release(seq.slot)
        # Counted before the caller wakes: a client that reads the metrics
        # right after its answer sees its request ended and its sequence free.
        failed = error is not None and not isinstance(error, DecoderClosedError)
        self.metrics.count_request("error" if failed else seq.stats.finish_reason or reason or "cancelled")
        with self.metrics.lock():
            self.metrics.active_sequences = len(self.active)
        seq.finish(reason, error)
        if self.on_end is not None:
            self.on_end(seq)

    def stop_due(self, now: float) -> None:
        """End the active sequences that were cancelled, closed or timed out."""
        for seq in list(self.active):
            reason = seq.stop_reason(now)
            if reason is not None:
                self.end(seq, reason)

    # ------------------------------------------------------------ one step
    def step(self, joining: int = 0) -> int:
        """One step over the active sequences; ``joining``: sequences waiting
        to be admitted (the batch is about to grow).  Returns the tokens emitted."""
        t_step = time.perf_counter()
        self.stop_due(t_step)
        if not self.active:
            return 0
        decoding = [s for s in self.active if s.prefilled]
        prefill = self._prefill_parts(len(decoding))
        if not decoding and not prefill:  # pragma: no cover - a pass must always fit one row
            raise SpecDecError(f"no row fits a pass of n_batch={self.target.n_batch}")
        works, cands, catch_up, timed = self._plan(decoding, prefill, joining)
        planned_rate = self.policy.last_rate
        if self.step_trace is not None:
            self._passes = ([], [])
        self.core.propose(works, catch_up)
        emitted = self.core.verify(works, prefill)
        for w, c in zip(works, cands):
            if w.verified:
                self.policy.learn(c, w.decision, w.route, w.drafted_alphas, w.first_token)
        if works and not prefill:
            self.policy.observe_step(len(works), any(w.gamma > 0 for w in works), bool(catch_up),
                                     timed or any(w.decision.explore for w in works), planned_rate, emitted,
                                     time.perf_counter() - t_step)
        dt = time.perf_counter() - t_step
        with self.metrics.lock():
            self.metrics.steps += 1
            self.metrics.step_seconds += dt
            self.metrics.tokens_generated += emitted
            self.metrics.record_rate(emitted, dt)
        if self.step_trace is not None:
            self._trace(self.step_trace, t_step, works, prefill, catch_up, planned_rate, emitted)
        return emitted

    def _prefill_parts(self, n_decoding: int) -> list[Rows]:
        """Prompt chunks of the sequences still taking in their prompt, within
        this step's prompt budget (small while others are decoding, so their
        next tokens are not held up; the whole batch when alone)."""
        budget = self.prefill_chunk if n_decoding else self.target.n_batch
        budget = min(budget, self.target.n_batch - n_decoding)
        parts: list[Rows] = []
        held = 0 if self.first_token_from_prompt else 1  # prompt tokens left to the first step
        timing = self.policy.verify_rows_untimed()
        for seq in self.active:
            if seq.prefilled or budget <= 0:
                continue
            have = self.target.n_past(seq.held_slot)
            left = len(seq.seq) - held - have
            n = min(left, budget)
            if timing and seq.gamma == "auto" and left - n < timing < left:
                n = left - timing  # the last rows go in as a verify-sized pass of their own: it times v(k) warm
            if seq.prompt_logprobs is not None:
                n = min(n, PROMPT_LOGPROB_ROWS)
            if n > 0:
                # The chunk that ends the prompt also asks for the last row's
                # logits: the first token is sampled from the prompt's own pass.
                last = have + n == len(seq.seq) and self.first_token_from_prompt
                rows = n if seq.prompt_logprobs is not None else 1 if last else 0
                parts.append(Rows(seq.held_slot, seq.seq[have:have + n], rows))
                budget -= n
        return parts

    def _plan(self, decoding: list[Sequence], prefill: list[Rows], joining: int
              ) -> tuple[list[Work], list[Candidate], list[Rows], bool]:
        """The policy's decisions as works, the draft's catch-up chunks, and
        whether one of them times a draft row (a measurement, which the
        drafting ledger leaves out as it does an exploring probe: a cold
        first draft pass would otherwise count against drafting)."""
        cands = [self._candidate(s) for s in decoding]
        fixed_rows = sum(len(p.tokens) for p in prefill)
        joining += len(self.active) - len(decoding)
        budget = 0
        if self.draft is not None:
            # A catch-up goes in chunks of this many rows, so the others' next
            # tokens are not held up; alone, in one pass, as a prompt does.
            alone = len(decoding) == 1 and not joining
            budget = self.draft.n_batch - len(decoding)
            budget = budget if alone else min(self.prefill_chunk, budget)
        timing = self.draft is not None and self.policy.draft_unmeasured()
        timed = False
        decisions = self.policy.plan(cands, fixed_rows, joining, budget)
        works, catch_up = [], []
        for s, c, d in zip(decoding, cands, decisions):
            works.append(Work(s, route=d.route, gamma=d.gamma, decision=d, forced=c.forced[:d.forced]))
            have = self.draft.n_past(s.held_slot) if self.draft is not None else 0
            if d.catch_up:
                catch_up.append(Rows(s.held_slot, s.seq[have:have + d.catch_up]))
            elif timing and not d.gamma and s.gamma == "auto" and have < len(s.seq) - 1:
                # The draft's cost is unknown: its next token is one row of a draft
                # pass as drafting runs it (with logits), which times T_draft(1).
                catch_up.append(Rows(s.held_slot, s.seq[have:have + 1], 1))
                timing, timed = False, True
        return works, cands, catch_up, timed

    def _candidate(self, s: Sequence) -> Candidate:
        room = s.room(self.target.n_ctx)
        forced: list = []
        if s.constraint is not None and s.gamma != 0 and room > 0:
            forced = s.constraint.forced_tokens(room)  # drafts that cost no pass (the state does not move)
        lookup = s.ngram
        match = lookup.match(s.seq + forced if forced else s.seq) if lookup is not None and room > len(forced) else None
        lag = len(s.seq) - self.draft.n_past(s.held_slot) if self.draft is not None else None
        remaining = min(s.max_tokens - s.stats.tokens, self.target.n_ctx - len(s.seq))
        return Candidate(plan=s.plan, gamma=s.gamma, room=room, remaining=remaining,
                         constrained=s.constraint is not None, match=match,
                         lookup_max=lookup.max_draft if lookup is not None else 0, draft_lag=lag, forced=forced)

    def _start_decoding(self, seq: Sequence) -> None:
        seq.prefilled = True
        assert seq.admitted is not None  # set on admission
        seq.stats.prompt_seconds = time.perf_counter() - seq.admitted
        if seq.ngram is not None:
            if seq.ngram.unwrap_lines:
                seq.ngram.set_reference(unwrapped_reference(seq.prompt, self.tokenizer))
            seq.ngram.begin(seq.seq)

    # ------------------------------------------------------------ StepObserver
    def draft_pass(self, rows: int, seconds: float) -> None:
        if self._passes is not None:
            self._passes[1].append((rows, 1000.0 * seconds, self.policy.planner.draft.time(rows)))
        self.policy.observe_draft(rows, seconds)
        with self.metrics.lock():
            self.metrics.draft_passes += 1
            self.metrics.draft_rows += rows
            self.metrics.draft_seconds += seconds

    def target_pass(self, rows: int, seconds: float) -> None:
        if self._passes is not None:
            self._passes[0].append((rows, 1000.0 * seconds, self.policy.planner.target.time(rows)))
        self.policy.observe_target(rows, seconds)
        with self.metrics.lock():
            self.metrics.target_passes += 1
            self.metrics.target_rows += rows
            self.metrics.target_seconds += seconds
        held = 0 if self.first_token_from_prompt else 1
        for seq in self.active:  # a prompt that went in whole: the sequence decodes from now on
            if not seq.prefilled and self.target.n_past(seq.held_slot) >= len(seq.seq) - held:
                self._start_decoding(seq)

    def verified(self, work: Work, sampling_seconds: float) -> None:
        with self.metrics.lock():
            self.metrics.sampling_seconds += sampling_seconds
            if work.gamma > len(work.free):  # forced rows are no drafts (the stats count them apart)
                free_accepted = sum(1 for i in work.free if i < work.accepted)
                self.metrics.drafted += work.gamma - len(work.free)
                self.metrics.accepted += work.accepted - free_accepted
                self.metrics.alpha_sum += float(sum(work.drafted_alphas))
                self.metrics.alpha_rows += len(work.drafted_alphas)
            self.metrics.forced += sum(1 for i in work.free if i < work.accepted)

    def first_token(self, seq: Sequence) -> None:
        ttft = time.perf_counter() - seq.submitted
        seq.stats.first_token_seconds = ttft
        self.metrics.record_first_token(ttft)

    def sequence_in(self, slot: int) -> Optional[Sequence]:
        for seq in self.active:
            if seq.slot == slot:
                return seq
        return None

    # ------------------------------------------------------------ tracing
    def _trace(self, trace: StepTrace, t_step: float, works: list[Work], prefill: list[Rows],
               catch_up: list[Rows], planned_rate: float, emitted: int) -> None:
        """Hand the step's record to the step trace (a failing trace is dropped, not the decoder)."""
        prompt_rows = sum(len(p.tokens) for p in prefill)
        passes, self._passes = self._passes or ([], []), None
        try:
            trace(StepRecord(
                start=t_step, seconds=time.perf_counter() - t_step,
                gammas=tuple(w.gamma for w in works), routes=tuple(w.route for w in works),
                probes=tuple(w.decision.probe for w in works),
                alpha_hats=tuple(w.decision.alpha_hat[:w.gamma] for w in works),
                alphas=tuple(w.alphas for w in works), accepted=tuple(w.accepted for w in works),
                prompt_rows=prompt_rows, catch_up_rows=sum(len(p.tokens) for p in catch_up),
                catch_up_gain=self.policy.catch_up_gain, planned_rate=planned_rate,
                plain_rate=self.policy.planner.plain_rate(len(works), prompt_rows) if works else 0.0,
                emitted=emitted, target_passes=tuple(passes[0]), draft_passes=tuple(passes[1])))
        except Exception:
            log.exception("the step trace failed; tracing stops")
            self.step_trace = None


def fail_all(loop: StepLoop, sequences: Seq[Sequence], failure: Optional[str]) -> None:
    """End ``sequences``: with a SpecDecError carrying ``failure`` if the
    decoder failed, else (a close) with a DecoderClosedError."""
    for seq in sequences:  # an error object of its own for each caller's traceback
        err = SpecDecError(failure) if failure else DecoderClosedError(
            f"the decoder was closed while request {seq.id} was "
            f"{'running' if seq.slot is not None else 'waiting'}")
        if seq in loop.active:
            loop.end(seq, "cancelled", err)
        elif not seq.finished:
            loop.metrics.count_request("cancelled")
            seq.finish("cancelled", err)
            if loop.on_end is not None:
                loop.on_end(seq)
