"""The step, written once: draft, one target pass, exact verify, roll back, emit.

Glossary (docs/math.md has the derivations):

- **γ** — draft tokens a sequence proposes in a step; 0 is a plain step.
- **q, p** — the draft's and the target's final sampling distributions at a
  position (temperature → top-k → top-p → min-p).
- **accepted** — a draft token x kept because u·q(x) < p(x), u ~ U[0, 1).
- **residual** — the token emitted at the first rejection, drawn from
  max(0, p − q), renormalised over the whole vocabulary by token id.
- **bonus** — the token emitted from the target's last row when every draft
  token was accepted.
- **α** — Σ min(p, q) of a verified row: the probability that a draft from q
  is accepted there (what the planner learns from).
- **catch-up** — tokens a draft model's cache lacks (after a prompt or plain
  steps), taken in by its first pass of a step.
- **mask, forced** — a grammar's allowed tokens at a position (everything
  else −∞ in the target's and the draft's rows alike); where it allows one
  token only, that token is *forced*: it joins the draft without a draft
  pass and is accepted with probability 1 (docs/math.md §11).

One step for the sequences of ``works`` (``StepCore.propose`` then
``StepCore.verify``):

1. draft: each n-gram route's lookup (free), then the draft model, one pass
   per depth for every sequence drafting that deep (its catch-up rows, and
   other sequences' catch-up chunks, ride in the first);
2. one target pass: every decoding sequence's last token and its drafts,
   and the prompt chunks of sequences still taking in their prompt;
3. per sequence, with its own parameters and random streams: the exact
   verify (``sampling.verify``: acceptance and residual in one C++ call),
   then both caches keep the accepted prefix only;
4. emit: tokens become text (stop strings, end-of-generation), statistics
   are recorded; a finished sequence is handed to the observer.

One sequence's failure (NaN logits, an exception of its own) ends that
sequence only.  Nothing here chooses γ: the works come planned.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Protocol
from typing import Sequence as Seq

import numpy as np

from .. import sampling
from ..constraints import bitmask
from ..drafters.vocab_map import DraftVocab
from ..errors import ConstraintError, InvalidLogitsError, SpecDecError
from .logprobs import row_logprobs
from .one_sequence import ArrayRows
from .protocols import LogitRowsView, Rows, SequenceLM, Tokenizer, eog_id_array
from .sequence import Sequence

__all__ = ["FORCED", "MODEL", "NGRAM", "StepCore", "StepObserver", "Work"]

log = logging.getLogger("specdec_cpu.core")

#: The draft routes: the draft model, prompt lookup (n-gram), a grammar's forced tokens alone.
MODEL, NGRAM, FORCED = "model", "ngram", "forced"


@dataclass
class Work:
    """What one decoding sequence does in a step, and what came of it.

    ``decision`` is the planner's record of the choice (handed back to it
    after the verify); ``alphas``, ``accepted`` and ``first_token`` are
    filled in by the verify.
    """

    seq: Sequence
    route: Optional[str] = None
    gamma: int = 0  # draft rows in all, the forced ones first
    decision: Any = None
    forced: Seq[int] = ()  # tokens a grammar forces next, drafted for free (the first len(forced) rows)
    free: List[int] = field(default_factory=list)  # rows drafted without a draft pass: forced ones
    consumed: int = 0  # draft tokens the grammar's state has consumed (to roll back after the verify)
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))  # the draft (set by propose)
    probs: Optional[np.ndarray] = None  # its q rows (model route)
    masks: Optional[np.ndarray] = None  # a constrained sequence's mask rows, one per verified row
    draft_seconds: float = 0.0
    alphas: tuple[float, ...] = ()  # Σ min(p, q) of every verified row
    drafted_alphas: tuple[float, ...] = ()  # of the rows the draft sampled (what acceptance is learnt from)
    accepted: int = 0
    first_token: Optional[int] = None  # the token emitted after the forced ones
    verified: bool = False

    def mask_row(self, i: int) -> np.ndarray:
        """Mask row ``i`` of a constrained sequence's work (``masks`` is set for those)."""
        assert self.masks is not None
        return self.masks[i]

    def q_row(self, i: int) -> np.ndarray:
        """q row ``i`` of a model-route work (``probs`` is set once it drafts)."""
        assert self.probs is not None
        return self.probs[i]


class StepObserver(Protocol):
    """What the core reports to the loop driving it."""

    def draft_pass(self, rows: int, seconds: float) -> None:
        """A draft-model pass over ``rows`` rows took ``seconds``."""

    def target_pass(self, rows: int, seconds: float) -> None:
        """The target pass over ``rows`` rows took ``seconds``."""

    def verified(self, work: Work, sampling_seconds: float) -> None:
        """``work``'s verify ran (its outcome is in it)."""

    def first_token(self, seq: Sequence) -> None:
        """``seq`` emitted its first token."""

    def end(self, seq: Sequence, reason: Optional[str], error: Optional[BaseException] = None) -> None:
        """``seq`` has finished (``reason``) or failed (``error``)."""

    def sequence_in(self, slot: int) -> Optional[Sequence]:
        """The active sequence holding ``slot``, if any."""


class StepCore:
    """Runs steps over a target (and optionally a draft) ``SequenceLM``.

    ``draft_source_ids`` is the target id of each of the draft's ids for a
    draft cut to part of the vocabulary (engine/vocab_cut.py).  ``names``
    are the models' file names for error messages.
    """

    def __init__(self, target: SequenceLM, draft: Optional[SequenceLM], tokenizer: Tokenizer,
                 observer: StepObserver, *, draft_source_ids: Optional[np.ndarray] = None,
                 names: tuple[str, str] = ("", "")) -> None:
        self.target, self.draft, self.tokenizer, self.observer = target, draft, tokenizer, observer
        self.draft_vocab = (DraftVocab(draft.n_vocab, target.n_vocab, draft_source_ids)
                            if draft is not None else None)
        self._names = tuple(f" ({n})" if n else "" for n in names)
        self._eog: Optional[np.ndarray] = None  # the target's end-of-generation ids, once a sequence bans them
        self._eog_bits: Optional[np.ndarray] = None  # the same as a mask row
        #: Whether a constrained sequence's draft samples under the grammar's mask (always, but for
        #: measuring what the mask buys: bench/structured.py turns it off; the output stays exact).
        self.mask_draft = True

    # ------------------------------------------------------------ drafting
    def propose(self, works: List[Work], catch_up: List[Rows]) -> None:
        """Draft for every work with a route: forced tokens and n-gram
        lookups, then one draft-model pass per depth (``catch_up`` chunks
        ride in the first).  A constrained sequence's mask rows are filled
        along its draft, its drafts are kept within the grammar, and a run
        of tokens the grammar forces after a drafted one joins the draft
        without a pass of its own.  A work whose draft came out empty, or
        whose draft pass failed, takes a plain step."""
        for w in works:
            try:
                self._start_draft(w)
            except Exception as exc:
                self._drafting_failed(w, exc)
        drafting = [w for w in works if w.route == MODEL and w.gamma > len(w.forced)]
        if self.draft is not None and (drafting or catch_up):
            for w in drafting:
                w.probs = w.seq.q_rows(w.gamma)
                for i in w.free:
                    self._one_hot(w, i)
            self._draft_passes(drafting, catch_up)
        for w in works:
            if w.route == MODEL and w.gamma == len(w.free):  # nothing sampled: one-hot rows only
                w.route, w.probs = (FORCED if w.gamma else None), None
            if w.seq.constraint is not None and not w.seq.finished:
                try:
                    w.seq.constraint.fill_mask(w.mask_row(w.gamma))  # the bonus row's
                except Exception as exc:
                    self._drafting_failed(w, exc)

    def _start_draft(self, w: Work) -> None:
        """A work's draft rows, its forced tokens first (the grammar's state
        follows them; verify rolls it back), then a prompt lookup's."""
        w.gamma = w.gamma if w.route is not None else 0
        f = min(len(w.forced), w.gamma)
        w.tokens = np.zeros(w.gamma, dtype=np.int32)
        w.tokens[:f] = w.forced[:f]
        w.forced, w.free = w.forced[:f], list(range(f))
        c = w.seq.constraint
        if c is not None:
            w.masks = w.seq.mask_rows(w.gamma + 1)
            for i in range(f):
                c.fill_mask(w.masks[i])
                c.consume((int(w.tokens[i]),))
        w.consumed = f if c is not None else 0
        if w.route == NGRAM and w.gamma > f:
            self._lookup(w, f)
        elif w.route != MODEL:
            w.gamma = f
        if w.gamma == 0:
            w.route = None

    def _drafting_failed(self, w: Work, exc: Exception) -> None:
        """A fault of one sequence's drafting (its grammar's matcher past a
        limit, say): that sequence alone fails, and takes no part in the
        passes of this step."""
        log.exception("drafting for request %d failed", w.seq.id)
        self._fail(w.seq, _fault(w.seq.id, "while drafting", exc))
        w.route, w.gamma = None, 0

    @staticmethod
    def _one_hot(w: Work, i: int) -> None:
        """q of a forced token: one-hot (the masked p is 1 there too)."""
        q = w.q_row(i)
        q.fill(0.0)
        q[w.tokens[i]] = 1.0

    def _lookup(self, w: Work, f: int) -> None:
        """Prompt lookup after the sequence and its forced tokens; a
        constrained sequence keeps the longest part its grammar allows."""
        seq = w.seq
        assert seq.ngram is not None and seq.rng_draft is not None  # an n-gram route's sequence has its drafter
        d = seq.ngram.propose(seq.seq + list(w.forced), w.gamma - f, seq.params, seq.rng_draft)
        n = f
        c = seq.constraint
        for t in d.tokens[:w.gamma - f].tolist():
            if c is not None:
                c.fill_mask(w.mask_row(n))
                if c.consume((t,)) != 1:
                    break
            w.tokens[n] = t
            n += 1
        w.gamma = n
        if c is not None:
            w.consumed = n

    def _draft_passes(self, drafting: List[Work], catch_up: List[Rows]) -> None:
        """Draft-model passes until every work's draft is full: each pass
        takes in a work's tokens its cache lacks (catch-up and forced ones
        included) and samples its next draft token."""
        draft = self.draft
        assert draft is not None  # propose drafts only with a draft model
        filled = {id(w): len(w.forced) for w in drafting}  # draft rows known
        # draft rows in the draft's cache (None: none yet)
        fed: dict[int, Optional[int]] = {id(w): None for w in drafting}
        first = True
        while True:
            live = [w for w in drafting if w.gamma > filled[id(w)] and not w.seq.finished]
            parts = list(catch_up) if first else []
            room = draft.n_batch - sum(len(p.tokens) for p in parts)
            fitting = []
            for w in live:
                toks = w.tokens[fed[id(w)] or 0:filled[id(w)]].tolist()
                if fed[id(w)] is None:
                    toks = w.seq.seq[draft.n_past(w.seq.held_slot):] + toks
                if len(toks) > room:
                    # The lags of several drafts' caches exceed one pass: this one drafts no more this
                    # step (exact either way: its γ does not depend on what is drawn) and catches up later.
                    w.gamma = filled[id(w)]
                    continue
                room -= len(toks)
                fed[id(w)] = filled[id(w)]
                parts.append(Rows(w.seq.held_slot, toks, 1))
                fitting.append(w)
            live = fitting
            if not parts:
                break
            first = False
            t0 = time.perf_counter()
            try:
                rows = draft.decode(parts)
            except SpecDecError as exc:  # the draft failed: these sequences keep what they have
                log.warning("draft pass failed (%s); %d sequences step without more draft", exc, len(live))
                for w in live:
                    w.gamma = filled[id(w)]
                break
            dt = time.perf_counter() - t0
            self.observer.draft_pass(sum(len(p.tokens) for p in parts), dt)
            for w, r in zip(live, rows[len(parts) - len(live):]):
                assert r is not None  # every live part asked for a row
                w.draft_seconds += dt
                filled[id(w)] = self._sample_draft(w, filled[id(w)], r)
            if not live:
                break
        for w in drafting:
            if w.seq.finished:
                w.route, w.gamma = None, 0

    def _sample_draft(self, w: Work, i: int, rows: LogitRowsView) -> int:
        """Draft token ``i`` of ``w`` from the draft's row (masked as the
        target's row of the same position), then the tokens the grammar
        forces after it; returns the draft rows now known.  A draft the
        grammar leaves nothing to propose, or an end-of-generation draft,
        ends here."""
        seq = w.seq
        c = seq.constraint
        try:
            assert self.draft_vocab is not None and seq.rng_draft is not None  # a draft model drafts
            if c is not None:
                c.fill_mask(w.mask_row(i))
            masked = c is not None and self.mask_draft
            changes = seq.changes(w.tokens, 1, first=i, masks=w.masks if masked else None)
            t = self.draft_vocab.sample_into(rows.view()[0], seq.params, seq.rng_draft, w.q_row(i), changes)
        except InvalidLogitsError as exc:
            self._fail(seq, InvalidLogitsError(
                f"the draft model produced invalid logits{self._names[1]} for request {seq.id} drafting "
                f"from position {len(seq.seq)}: {exc}"))
            return i
        except Exception as exc:  # a fault of this sequence's draft: it alone fails
            self._drafting_failed(w, exc)
            return i
        if t < 0:  # the cut draft has none of the tokens allowed here
            w.gamma = i
            return i
        w.tokens[i] = t
        i += 1
        if c is None:
            return i
        try:
            return self._follow_grammar(w, i, t)
        except Exception as exc:
            self._drafting_failed(w, exc)
            return i

    def _follow_grammar(self, w: Work, i: int, t: int) -> int:
        """The grammar's state after draft token ``t`` (row ``i - 1``), and
        the tokens it forces after it joining the draft; returns the draft
        rows now known."""
        c = w.seq.constraint
        assert c is not None
        if c.consume((t,)) != 1:
            # An unmasked draft (mask_draft off) left the grammar: the token stays the last
            # row, which the verify rejects (p = 0 there), drawing from the residual.  Dropping
            # it would skew the law: its absence would depend on its own value.
            w.gamma = i
            return i
        w.consumed = i
        for t in c.forced_tokens(w.gamma - i) if not c.ended else ():
            c.fill_mask(w.mask_row(i))
            c.consume((t,))
            w.tokens[i] = t
            self._one_hot(w, i)
            w.free.append(i)
            i += 1
            w.consumed = i
        if c.ended:  # nothing can follow what the grammar ends with
            w.gamma = i
        return i

    # ------------------------------------------------------------ the target pass
    def verify(self, works: List[Work], prefill: List[Rows]) -> int:
        """One target pass over every sequence's rows, then each sequence's
        verify, roll-back and delivery.  Returns the tokens emitted."""
        works = [w for w in works if not w.seq.finished]
        parts = list(prefill)
        for w in works:
            toks = [w.seq.seq[-1]] + (w.tokens[:w.gamma].tolist() if w.gamma else [])
            parts.append(Rows(w.seq.held_slot, toks, w.gamma + 1))
        if not parts:
            return 0
        n_rows = sum(len(p.tokens) for p in parts)
        t0 = time.perf_counter()
        try:
            rows = self.target.decode(parts)
        except SpecDecError as exc:  # nothing changed in the caches; these sequences fail
            log.error("target pass over %d rows failed: %s", n_rows, exc)
            for p in parts:
                seq = self.observer.sequence_in(p.seq)
                if seq is not None:
                    self._fail(seq, exc)
            return 0
        dt = time.perf_counter() - t0
        self.observer.target_pass(n_rows, dt)
        emitted = 0
        for part, r in zip(prefill, rows):
            if r is not None:
                r = self._prompt_logprobs(part, r)
            if r is not None:
                emitted += self._first_token(part, r, dt)
        for w, r in zip(works, rows[len(prefill):]):
            assert r is not None  # a work's part asks for its rows
            emitted += self._verify_one(w, r, dt)
        return emitted

    def _prompt_logprobs(self, part: Rows, rows: LogitRowsView) -> Optional[LogitRowsView]:
        """The rows of a prompt chunk the first token is sampled from (None:
        it is not the last chunk).  A sequence asking for its prompt's
        log-probabilities has every row of each chunk: those that predict
        prompt tokens are recorded (the model's own distribution)."""
        seq = self.observer.sequence_in(part.seq)
        if seq is None or seq.finished:
            return None
        if seq.prompt_logprobs is None:
            return rows
        first = self.target.n_past(part.seq) - part.n_logits + 1  # the position row 0 predicts
        known = max(0, min(part.n_logits, len(seq.prompt) - first))
        logits = rows.view()
        try:
            if known:
                seq.prompt_entries += row_logprobs(logits[:known], seq.prompt[first:first + known],
                                                   seq.prompt_logprobs, "model", seq.params)
        except InvalidLogitsError as exc:
            self._fail(seq, InvalidLogitsError(
                f"the target model produced invalid logits{self._names[0]} for request {seq.id} in its prompt "
                f"(positions {first - 1} to {first + known - 2}): {exc}"))
            return None
        except Exception as exc:  # a fault of this sequence's: it alone fails
            log.exception("the prompt log-probabilities of request %d failed", seq.id)
            self._fail(seq, _fault(seq.id, "in its prompt's log-probabilities", exc))
            return None
        if seq.scored:
            self.observer.end(seq, "length")
            return None
        return ArrayRows(logits[known:]) if known < part.n_logits else None

    def _first_token(self, part: Rows, rows: LogitRowsView, target_seconds: float) -> int:
        """A sequence's prompt is in: sample its first token from the prompt's
        last row (a plain step)."""
        seq = self.observer.sequence_in(part.seq)
        if seq is None or seq.finished:
            return 0
        t0 = time.perf_counter()
        try:
            assert seq.rng_verify is not None  # seeded on admission
            masks = None
            if seq.constraint is not None:
                masks = seq.mask_rows(1)
                seq.constraint.fill_mask(masks[0])
            unbanned = self._ban_eog(seq, rows, masks)
            changes = seq.changes((), 1, masks=masks)
            logits = rows.view()
            token = sampling.sample(logits[0], seq.params, seq.rng_verify, changes.row(0))
            if seq.constraint is not None:
                seq.constraint.consume((token,))
            logprobs = self._logprobs(seq, logits, [token], changes, unbanned)
        except InvalidLogitsError as exc:
            self._fail(seq, InvalidLogitsError(
                f"the target model produced invalid logits{self._names[0]} for request {seq.id} at the end "
                f"of its prompt (position {len(seq.seq) - 1}): {exc}"))
            return 0
        except Exception as exc:  # a fault of this sequence's sampling: it alone fails
            log.exception("sampling the first token of request %d failed", seq.id)
            self._fail(seq, _fault(seq.id, "at its first token", exc))
            return 0
        stats = seq.stats
        stats.steps += 1
        stats.gammas.append(0)
        stats.target_seconds += target_seconds
        stats.sampling_seconds += time.perf_counter() - t0
        emitted = self.emit(seq, [token], logprobs)
        _arm(seq)
        return emitted

    def _verify_one(self, w: Work, rows: LogitRowsView, target_seconds: float) -> int:
        seq = w.seq
        stats = seq.stats
        n_old = len(seq.seq)
        t0 = time.perf_counter()
        c = seq.constraint
        alphas: tuple[float, ...]
        try:
            assert seq.rng_verify is not None  # seeded on admission
            unbanned = self._ban_eog(seq, rows, w.masks if c is not None else None)
            logits = rows.view()
            changes = seq.changes(w.tokens[:w.gamma], w.gamma + 1, masks=w.masks if c is not None else None)
            if w.gamma == 0:
                new = [sampling.sample(logits[0], seq.params, seq.rng_verify, changes.row(0))]
                n_acc, alphas = 0, ()
            else:
                res = sampling.verify(logits, w.tokens[:w.gamma], None if w.probs is None else w.probs[:w.gamma],
                                      seq.params, seq.rng_verify, changes)
                n_acc, alphas = res.n_accepted, tuple(float(a) for a in res.alphas)
                new = w.tokens[:n_acc].tolist() + [res.token]
            cut = None
            if c is None and seq.trigger is not None:
                new, n_acc, cut = _cut_after(new, n_acc, seq.trigger[0])
            if c is not None:  # the grammar follows the accepted tokens and the one after them
                c.rollback(w.consumed - n_acc)  # a draft token outside the grammar was never consumed (nor accepted)
                c.consume((new[-1],))
            logprobs = self._logprobs(seq, logits, new, changes, unbanned)
        except InvalidLogitsError as exc:
            self._fail(seq, InvalidLogitsError(
                f"the target model produced invalid logits{self._names[0]} for request {seq.id} at positions "
                f"{n_old - 1} on (row r predicts position {n_old} + r): {exc}"))
            return 0
        except Exception as exc:  # a fault of this sequence's step: it alone fails
            log.exception("verify of request %d failed", seq.id)
            self._fail(seq, _fault(seq.id, "in its verify step", exc))
            return 0
        t_sample = time.perf_counter() - t0
        # Every cache keeps only a prefix of the sequence: rejected drafts go,
        # and so do draft tokens of a step whose draft was abandoned.
        slot = seq.held_slot
        self.target.truncate(slot, n_old + n_acc)
        if self.draft is not None:
            self.draft.truncate(slot, min(self.draft.n_past(slot), n_old + n_acc))
        if seq.ngram is not None:
            seq.ngram.rollback(n_old + n_acc)
        f = len(w.forced)
        free = set(w.free)  # forced rows (α = 1) are neither drafts nor acceptance evidence
        stats.gammas.append(w.gamma)
        counted = n_acc
        if cut is not None:  # the drafts after a trigger were abandoned, not rejected: the step counts up to it
            w.gamma, alphas, counted = cut, alphas[:cut], cut
        w.alphas, w.accepted, w.verified = alphas, counted, True
        w.drafted_alphas = tuple(a for i, a in enumerate(alphas) if i not in free)
        w.first_token = int(new[f]) if f < len(new) else None
        n_free_accepted = sum(1 for i in free if i < counted)
        stats.steps += 1
        stats.target_seconds += target_seconds
        stats.draft_seconds += w.draft_seconds
        stats.sampling_seconds += t_sample
        stats.forced += n_free_accepted
        if w.gamma > len(free):
            assert w.route is not None  # a work that drafted has a route
            stats.drafted += w.gamma - len(free)
            stats.accepted += counted - n_free_accepted
            stats.alpha_sum += float(sum(w.drafted_alphas))
            stats.alpha_rows += len(w.drafted_alphas)
            stats.record_drafter(w.route, w.gamma - len(free), counted - n_free_accepted)
        self.observer.verified(w, t_sample)
        emitted = self.emit(seq, new, logprobs)
        _arm(seq)
        return emitted

    def _logprobs(self, seq: Sequence, logits: np.ndarray, tokens: List[int], changes: sampling.Changes,
                  unbanned: Optional[np.ndarray] = None) -> Optional[list]:
        """The log-probabilities of ``tokens`` (rows 0.. of ``logits``), if the sequence asked for them;
        ``unbanned``: the end-of-generation columns as the model gave them, before ``ignore_eos``."""
        if seq.logprobs is None:
            return None
        k = len(tokens)
        if unbanned is not None:  # "model" log-probabilities are the model's, before any ban
            logits = logits[:k].copy()
            logits[:, self._eog] = unbanned[:k]
        if changes.mask is not None or changes.sparse is not None:
            changes = sampling.Changes(None if changes.mask is None else changes.mask[:k],
                                       None if changes.sparse is None else _first_rows(changes.sparse, k))
        return row_logprobs(logits, tokens, seq.logprobs, seq.logprob_mode, seq.params, changes)

    def _ban_eog(self, seq: Sequence, rows: LogitRowsView, masks: Optional[np.ndarray] = None
                 ) -> Optional[np.ndarray]:
        """A sequence with ``ignore_eos``: its target rows give the end-of-generation ids probability 0,
        but for rows where a grammar's mask (``masks``) allows nothing else (core/penalties.py).
        Returns the columns as they were when the sequence reports the model's log-probabilities."""
        if not seq.params.ignore_eos:
            return None
        if self._eog is None:
            self._eog = eog_id_array(self.tokenizer, self.target.n_vocab)
        unbanned = rows.view()[:, self._eog].copy() if seq.logprobs is not None and seq.logprob_mode == "model" \
            else None
        if masks is None:
            rows.mask_columns(self._eog)
            return unbanned
        if self._eog_bits is None:
            self._eog_bits = bitmask.from_ids(self._eog, masks.shape[1] * 32, np.uint32)
        n_rows = rows.view().shape[0]
        banned = [i for i in range(n_rows) if not bitmask.allows_only(masks[i], self._eog_bits)]
        if banned:
            rows.mask_columns(self._eog, banned)
        return unbanned

    # ------------------------------------------------------------ emitting
    def emit(self, seq: Sequence, new: List[int], logprobs: Optional[list] = None) -> int:
        """Append ``new`` to ``seq`` up to its end (an end-of-generation or
        stop token, a stop string, ``max_tokens``, the context), delivering
        its text (and ``logprobs``, one per token of ``new``); returns the
        tokens appended."""
        stats = seq.stats
        stop_ids = seq.params.stop_token_ids
        n = 0
        # The grammar's state is at the end of ``new`` already: whether it is
        # complete (only an end may follow) is a question for its last token.
        complete = seq.constraint is not None and seq.constraint.finished
        for i, tok in enumerate(new):
            if self.tokenizer.is_eog(tok) or (stop_ids and tok in stop_ids):
                stats.finish_reason = "stop"
                if logprobs is not None:
                    seq.end_logprob = logprobs[i]
                break
            seq.seq.append(tok)
            seq.out.append(tok)
            if logprobs is not None:
                seq.token_logprobs.append(logprobs[i])
            if seq.penalties is not None:
                seq.penalties.append((tok,))
            stats.tokens += 1
            n += 1
            if stats.tokens == 1:
                self.observer.first_token(seq)
            seq.deliver(seq.text.feed(self.tokenizer.token_bytes(tok)))
            if seq.text.stopped or (complete and i == len(new) - 1):
                stats.finish_reason = "stop"
                break
            if stats.tokens >= seq.max_tokens:
                stats.finish_reason = "length"
                break
        if stats.finish_reason is None and len(seq.seq) > self.target.n_ctx:
            stats.finish_reason = "context"
        if stats.finish_reason is not None:
            self.observer.end(seq, stats.finish_reason)  # rings
        else:
            seq.ring()
        return n

    # ------------------------------------------------------------ internals
    def _fail(self, seq: Sequence, error: BaseException) -> None:
        self.observer.end(seq, None, error)


def _fault(seq_id: int, where: str, exc: Exception) -> SpecDecError:
    """One sequence's failure; a grammar's (its matcher past a limit: the
    request's doing, not the server's) keeps its type."""
    kind = ConstraintError if isinstance(exc, ConstraintError) else SpecDecError
    return kind(f"request {seq_id} failed {where}: {exc or repr(exc)}")


def _cut_after(new: List[int], n_acc: int, trigger: int) -> "tuple[List[int], int, Optional[int]]":
    """A step's tokens up to the first ``trigger`` (a triggered grammar's
    token), its accepted drafts with them, and (if it cut) the drafts up to
    and including the trigger, all accepted.  The tokens after it were
    verified without the grammar that applies from there, so they go: the
    next step samples those positions masked (docs/math.md §11)."""
    if trigger in new[:-1]:
        j = new.index(trigger)
        return new[:j + 1], j, j + 1
    return new, n_acc, None


def _arm(seq: Sequence) -> None:
    """A triggered grammar becomes the sequence's constraint once its token
    is the last one emitted: it masks every position after it."""
    if seq.trigger is not None and not seq.finished and seq.out and seq.out[-1] == seq.trigger[0]:
        seq.constraint, seq.trigger = seq.trigger[1], None


def _first_rows(sparse: tuple, k: int) -> tuple:
    """The first ``k`` rows of ``sampling.Changes.sparse``."""
    offsets, ids, pos, neg, add = sparse
    end = int(offsets[k])
    return offsets[:k + 1], ids[:end], pos[:end], neg[:end], add[:end]
