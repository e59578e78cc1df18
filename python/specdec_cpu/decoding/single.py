"""SpeculativeDecoder: one conversation, decoded on the caller's thread.

It is the one-sequence case of the step loop (decoding/loop.py) that the
batched decoder runs for many: the same step core, the same draft policy,
driven here by the thread that calls ``generate`` or reads a ``stream``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Generator, Optional, Union
from typing import Sequence as Seq

from ..core.one_sequence import OneSequenceLM
from ..core.protocols import CausalLM, Tokenizer
from ..core.request_args import GAMMA_LIMIT, Prompt
from ..core.sequence import GammaSetting, SeedSequence, Sequence, choice_seed
from ..core.stats import Generation
from ..core.text import stop_strings
from ..errors import DecoderClosedError, UnsupportedModelError
from ..params import SamplingParams
from ..settings import DecoderSettings
from .front import CallerCalls, DecoderFront, generation_or_raise, make_policy, settings_of
from .loop import StepLoop
from .metrics import ServingMetrics

__all__ = ["Generation", "SpeculativeDecoder"]

_LOCK_POLL = 0.05  # seconds between cancel/timeout checks while waiting for the decoder


class SpeculativeDecoder(DecoderFront):
    """Exact speculative decoding of a target model with a cheap drafter.

    Every emitted token is distributed exactly as the target's sampling
    distribution under the given ``SamplingParams``; the drafter only changes
    how many tokens one target pass yields.  ``gamma=0`` is plain decoding
    through the same engine, ``gamma="auto"`` lets the planner choose γ per step
    from measured costs and acceptance (0 where speculation cannot pay).

    The drafters: a draft model (``draft``, sharing the target's vocabulary)
    and prompt lookup (``ngram=True``, settings in ``ngram_kwargs``), alone or
    together (the planner then picks the better route each step).

    One decoder holds one conversation's caches: calls are serialised by an
    internal lock, so sharing a decoder between threads is safe but not
    parallel (``BatchedDecoder`` decodes many requests together).  A request
    waiting for the lock still honours its ``cancel`` and ``timeout``.

    Stopping early (``cancel``, ``timeout``, closing a stream, an exception
    such as ``InvalidLogitsError`` or ``KeyboardInterrupt``) leaves the caches
    consistent: the next call gives what a fresh decoder would.

    How far a step drafts: a fixed ``gamma`` (here or per call) is used as
    given; with ``gamma="auto"`` the draft model's γ stays within
    ``gamma_max`` and prompt lookup's within its ``max_draft``.  Every route
    is also capped at ``gamma_cap`` = the target's ``n_batch`` − 1, since a
    verify pass scores γ + 1 rows in one llama.cpp batch.

    ``seed`` seeds the decoder's sequence of request seeds: a request whose
    ``SamplingParams.seed`` is None draws from the next, one with a seed
    from its own.  A seed repeats a run only with the same model files,
    kernel ISA and CPU, a fixed γ (or greedy decoding) and the same cache
    history, e.g. a fresh or ``reset()`` decoder (docs/math.md §9).
    """

    _target_lm: OneSequenceLM  # a one-sequence view of each model (resynced after an interrupted call)
    _draft_lm: Optional[OneSequenceLM]

    def __init__(self, target: CausalLM, tokenizer: Tokenizer, draft: Optional[CausalLM] = None, *,
                 gamma: GammaSetting = "auto", gamma_max: int = 12, seed: Optional[int] = None,
                 cost_model: Any = None, ngram: bool = False, ngram_kwargs: Optional[dict] = None,
                 draft_source_ids: Any = None, names: tuple[str, str] = ("", "")) -> None:
        if isinstance(gamma, int) and not isinstance(gamma, bool) and isinstance(gamma_max, int) \
                and gamma_max < gamma <= GAMMA_LIMIT:
            gamma_max = gamma
        settings = DecoderSettings(gamma=gamma, gamma_max=gamma_max, seed=seed, ngram=ngram,
                                   ngram_kwargs=ngram_kwargs, calibration=None)
        settings.check_drafter(draft is not None)
        _check_rollback(target, draft, ngram)
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.gamma, self.gamma_max = gamma, gamma_max
        self.ngram = ngram
        self._has_drafter = draft is not None or ngram
        self._target_lm = OneSequenceLM(target)
        self._draft_lm = OneSequenceLM(draft) if draft is not None else None
        #: The largest γ one verify pass can hold: it scores γ + 1 rows in one
        #: llama.cpp batch, so every route's γ is capped at the target's n_batch − 1.
        self.gamma_cap = max(0, min(GAMMA_LIMIT, self._target_lm.n_batch - 1))
        if isinstance(gamma, int) and gamma > self.gamma_cap:
            warnings.warn(f"gamma={gamma} needs {gamma + 1} rows in one verify pass but the target's "
                          f"n_batch is {self.gamma_cap + 1}: steps use at most γ = {self.gamma_cap}", stacklevel=2)
        self._seeds = SeedSequence(seed)
        self._metrics = ServingMetrics(max_sequences=1)
        self._loop = StepLoop(
            target=self._target_lm, draft=self._draft_lm, tokenizer=tokenizer, policy=self._policy(None),
            prefill_chunk=self._target_lm.n_batch, ngram_kwargs=dict(ngram_kwargs or {}) if ngram else None,
            metrics=self._metrics, draft_source_ids=draft_source_ids, names=names, first_token_from_prompt=False)
        self.cost_model = cost_model
        self._lock = threading.Lock()
        self._active: Optional[_Run] = None  # the run holding the lock, if any
        self.target_path: Optional[str] = None
        self.draft_path: Optional[str] = None
        self.n_threads: Optional[int] = None
        self._owned: Any = None  # what close() frees besides the contexts: from_gguf's model pair
        self._closed = False
        self._calls = CallerCalls("SpeculativeDecoder")
        #: after a run, give back the thread's llama.cpp workers (from_gguf: engine.release_threads)
        self._release_threads: Callable[[], object] = lambda: None

    @property
    def cost_model(self) -> Any:
        """The pair's costs the planner started from (a ``CostModel``, or None for priors)."""
        return self._cost_model

    @cost_model.setter
    def cost_model(self, value: Any) -> None:
        self._cost_model = value
        self._loop.policy = self._policy(value)

    def _policy(self, cost_model: Any) -> Any:
        # One sequence: a planned pass is one verify, at most gamma_cap + 1 rows, and a
        # probe or a fixed γ takes in whatever its draft lacks that one draft pass holds.
        lm = self._draft_lm
        return make_policy(cost_model, self._target_lm, lm, gamma_max=min(self.gamma_max, self.gamma_cap),
                           max_rows=self.gamma_cap + 1,
                           catch_up_limit=lm.n_batch - 1 if lm is not None else 0)

    @property
    def policy(self) -> Any:
        """The draft policy planning every step (its ``estimates()`` are α̂ and the pass times)."""
        return self._loop.policy

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_gguf(cls, target: Union[str, os.PathLike], draft: Optional[Union[str, os.PathLike]] = None, *,
                  settings: Optional[DecoderSettings] = None, progress: Optional[Callable[[str], None]] = None,
                  **kwargs: Any) -> "SpeculativeDecoder":
        """Load a target (and optionally a draft) GGUF model through llama.cpp.

        The settings (``DecoderSettings``, or its fields as keywords: ``gamma``,
        ``gamma_max``, ``ngram``, ``ngram_kwargs``, ``draft_vocab``,
        ``calibration``, ``n_threads``, ``n_ctx``, ``n_batch``, ``seed``) are
        checked before anything loads.  The vocabularies are checked for
        compatibility at load (``VocabMismatchError`` names the first
        differing ids).

        ``calibration`` seeds the γ planner: ``"auto"`` (default) uses the
        stored calibration of this pair on this machine, and without one the
        planner learns the pass times from the first passes (stored for next
        time); ``"cached"`` uses the stored one or none; ``"measure"`` runs
        the full calibration now (timings and α at default sampling); a
        ``CostModel`` is used as given; ``None`` starts from priors.  In every
        case the planner keeps refining its estimates from real steps.

        ``draft_vocab=N`` drafts with a copy of the draft cut to its first N
        ids and its control tokens (written once to the cache): cheaper draft
        passes, the same exact output (docs/math.md §10).  For Qwen2.5,
        98304 keeps the acceptance of English and code (bench/RESULTS.md).
        """
        from .. import engine  # the only place llama.cpp is touched

        s = settings_of(settings, kwargs, DecoderSettings)
        s.check_drafter(draft is not None)
        pair = engine.load_pair(target, draft, draft_vocab=s.draft_vocab, progress=progress)
        with pair.closed_on_error():
            dec = cls._over_pair(pair, s, progress)
            dec._owned = pair
        return dec

    @classmethod
    def _over_pair(cls, pair: Any, s: DecoderSettings, progress: Optional[Callable[[str], None]]
                   ) -> "SpeculativeDecoder":
        """A decoder with contexts of its own over a loaded ``ModelPair``."""
        from .. import engine
        from ..planning.calibration import initial_costs

        target_ctx = engine.LlamaContext(pair.target, n_ctx=s.n_ctx, n_batch=s.n_batch, n_threads=s.n_threads)
        draft_ctx = (engine.LlamaContext(pair.draft, n_ctx=s.n_ctx, n_batch=s.n_batch, n_threads=s.n_threads)
                     if pair.draft is not None else None)
        dec = cls(target_ctx, engine.LlamaTokenizer(pair.target), draft_ctx, gamma=s.gamma,
                  gamma_max=s.gamma_max, seed=s.seed, ngram=s.ngram, ngram_kwargs=s.ngram_kwargs,
                  draft_source_ids=pair.draft.source_ids if pair.draft is not None else None,
                  names=(pair.target.path, pair.draft.path if pair.draft is not None else ""))
        dec.target_path = pair.target.path
        dec.draft_path = pair.draft.path if pair.draft is not None else None
        dec.n_threads = target_ctx.n_threads
        dec.set_chat_template(s.chat_template)
        if dec.has_drafter:
            # Without a stored calibration the planner learns the pass times from the
            # first passes (docs/planning.md §4): no measurement before the first request.
            dec.cost_model = initial_costs(dec, s.calibration, k_max=_plan_rows(dec), measure_missing=False,
                                           progress=progress)
        dec._release_threads = engine.release_threads
        dec._release_threads()  # a calibration's passes ran on this thread
        return dec

    # ------------------------------------------------------------------ public API
    def generate(self, prompt: Prompt, *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
                 stop: Optional[Seq[str]] = (), gamma: Optional[GammaSetting] = None,
                 cancel: Optional[threading.Event] = None, timeout: Optional[float] = None,
                 grammar: Any = None, logprobs: Optional[int] = None, logprob_mode: str = "model",
                 prompt_logprobs: Optional[int] = None) -> Generation:
        """Generate a continuation of ``prompt`` (text, UTF-8 bytes, or token ids).

        ``grammar`` constrains the output: a ``constraints.Grammar`` (JSON
        schema, Lark, regex, GBNF), or a JSON schema as a dict or a pydantic
        model class.  The output is then distributed exactly as the target's
        sampling distribution masked to the grammar, and tokens the grammar
        forces are drafted for free (docs/math.md §11).

        ``logprobs`` (0-20) asks for each output token's log-probability and
        that many alternatives (``Generation.logprobs``), of the target
        model's own distribution (``logprob_mode="model"``) or of the one
        the token was sampled from (``"sampling"``); core/logprobs.py.
        ``prompt_logprobs`` (0-20) asks the same of the prompt's tokens,
        each under the model's distribution after the tokens before it
        (``Generation.prompt_logprobs``: one entry per prompt token after
        the first; no cached prefix is reused for such a call); with it,
        ``max_tokens=0`` scores the prompt and samples nothing.

        ``cancel`` (a ``threading.Event``) and ``timeout`` (seconds for the
        whole call, waiting for the decoder included) stop generation at the
        next step boundary; ``generate`` then raises ``GenerationCancelled``
        whose ``partial`` is the Generation so far (``finish_reason``
        ``"cancelled"`` or ``"timeout"``) and ``reason`` says which.  The
        decoder is ready for the next call either way.
        """
        run = self._run(prompt, max_tokens, params, stop, gamma, cancel, timeout, grammar=grammar,
                        logprobs=logprobs, logprob_mode=logprob_mode,
                        prompt_logprobs=prompt_logprobs)
        pieces = run.iterate()
        try:
            for _ in pieces:
                pass
        finally:
            pieces.close()  # after a KeyboardInterrupt between two steps: release the decoder now
        assert run.result is not None  # the run has ended
        return generation_or_raise(run.result, timeout)

    def stream(self, prompt: Prompt, *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
               stop: Optional[Seq[str]] = (), gamma: Optional[GammaSetting] = None,
               cancel: Optional[threading.Event] = None, timeout: Optional[float] = None,
               grammar: Any = None, logprobs: Optional[int] = None, logprob_mode: str = "model",
               prompt_logprobs: Optional[int] = None) -> "_Stream":
        """Yield text pieces as they are accepted.

        Unlike ``generate``, a stream simply ends when ``cancel`` is set or
        ``timeout`` passes (no exception).  Once it has ended, or been closed,
        its ``result`` attribute is the Generation, whose ``finish_reason``
        says why (``"cancelled"`` also after ``close()``).  A stream holds the
        decoder's lock while it is suspended: close it (``close()``, a
        ``with`` block, or dropping the last reference) when stopping early;
        that stops generation at once and leaves the decoder ready for the
        next call.  Argument errors are raised here, not at the first piece.
        ``grammar``, ``logprobs`` and ``logprob_mode`` are as for ``generate``.
        """
        return _Stream(self._run(prompt, max_tokens, params, stop, gamma, cancel, timeout, grammar=grammar,
                                 logprobs=logprobs, logprob_mode=logprob_mode,
                                 prompt_logprobs=prompt_logprobs))

    def generate_choices(self, prompt: Prompt, n: int, **kwargs: Any) -> list[Generation]:
        """``n`` independent continuations of ``prompt`` (OpenAI's ``n``), one
        after the other; keyword arguments as for :meth:`generate`.  Each
        reuses the prompt the cache holds from the one before (no second
        prefill).  Choice i > 0 of a request with a seed samples from a seed
        derived from it and i (``BatchedDecoder.generate_choices`` decodes
        the choices together)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
            raise ValueError(f"n must be an int in [1, 128] (choices), got {n!r}")
        params = kwargs.pop("params", SamplingParams())
        kwargs["stop"] = stop_strings(kwargs.get("stop", ()))  # an iterator is read once, for every choice
        out = []
        for i in range(n):
            p = (params if i == 0 or params.seed is None
                 else dataclasses.replace(params, seed=choice_seed(params.seed, i)))
            out.append(self.generate(prompt, params=p, **kwargs))
        return out

    def close(self) -> None:
        """Free the llama.cpp contexts, and the models if :meth:`from_gguf`
        loaded them (idempotent).  A call running on another thread finishes
        first; a stream this thread left open is closed.  Later calls raise
        ``DecoderClosedError``.  Also ends a ``with`` block."""
        if self._active is not None and self._active.thread == threading.get_ident():
            self._active.close()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._calls.close()  # a caller still tokenizing finishes first
            for ctx in (self.target, self.draft):
                close = getattr(ctx, "close", None)  # in-process test models have nothing to free
                if close is not None:
                    close()
            if self._owned is not None:
                self._owned.close()

    def reset(self) -> None:
        """Forget the cached conversation (nothing to forget once closed)."""
        if self._closed:
            return
        if self._active is not None and self._active.thread == threading.get_ident():
            self._active.close()
        with self._lock:
            for lm in (self._target_lm, self._draft_lm):
                if lm is not None:
                    lm.clear(0)

    def metrics(self) -> Any:
        """Counters since the decoder started (as ``BatchedDecoder.metrics``)."""
        return self._metrics.snapshot()

    # ------------------------------------------------------------------ internals
    def _run(self, prompt, max_tokens, params, stop, gamma, cancel, timeout, **options: Any) -> "_Run":
        seq = self._sequence(Sequence, prompt, max_tokens, params, stop, gamma, cancel, timeout, self.gamma_cap,
                             **options)
        self._seed_of(seq)
        return _Run(self, seq)

    @property
    def n_ctx(self) -> int:
        """Tokens a sequence may hold: the smaller of the two contexts."""
        return min(self.target.n_ctx, self.draft.n_ctx if self.draft is not None else self.target.n_ctx)


class _Stream:
    """What ``stream`` returns: an iterator of text pieces, ``result`` (a
    Generation) once it has ended or been closed.  Leaving a ``with`` block
    closes it.  Nothing else refers to it, so dropping the last reference
    closes the generation too (at once, not at the next garbage collection)."""

    def __init__(self, run: "_Run") -> None:
        self._run = run
        self._gen = run.iterate()

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self) -> str:
        return next(self._gen)

    @property
    def result(self) -> Optional[Generation]:
        return self._run.result

    def close(self) -> None:
        """Stop early; the decoder's caches stay consistent."""
        self._run.close()

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Run:
    """One generation; ``iterate()`` runs it, yielding text pieces, and
    ``result`` is its Generation once it has ended or been closed."""

    def __init__(self, dec: SpeculativeDecoder, seq: Sequence) -> None:
        self.dec, self.seq = dec, seq
        self.thread: Optional[int] = None
        self._gen: Optional[weakref.ref] = None  # weak: the generator refers to us

    @property
    def result(self) -> Optional[Generation]:
        return self.seq.result

    def iterate(self) -> Generator[str, None, None]:
        gen = self._generate()
        self._gen = weakref.ref(gen)
        return gen

    def close(self) -> None:
        """Stop early; the decoder's caches stay consistent.  From another
        thread than the one reading, the stream stops at its next step."""
        gen = self._gen() if self._gen is not None else None
        if gen is not None:
            self.seq.closed = True  # a reader in another thread stops at its next step
            try:
                gen.close()
            except ValueError:  # "generator already executing": that reader has it, and will stop
                pass
        if not self.seq.finished:  # closed before it started (counted as a request all the same)
            self.dec._loop.end(self.seq, "cancelled")

    def _generate(self) -> Generator[str, None, None]:
        dec, seq = self.dec, self.seq
        active = dec._active
        if active is not None and active.thread == threading.get_ident():
            # A stream this thread left suspended: it can never resume before
            # we finish, so end it now rather than deadlock on the lock.
            active.close()
        loop = dec._loop
        if not self._acquire(dec._lock):
            return
        if dec._closed:  # closed while this call waited for the lock
            dec._lock.release()
            loop.end(seq, "cancelled")
            raise DecoderClosedError("the SpeculativeDecoder was closed while this call waited", seq.result)
        try:
            dec._active, self.thread = self, threading.get_ident()
            loop.admit(seq)
            while not seq.finished:
                loop.step()
                yield from self._pieces()
            yield from self._pieces()  # what finishing flushed
            if seq.error is not None:
                raise seq.error
        finally:
            for lm in (dec._target_lm, dec._draft_lm):  # an interrupted model call: model and mirror agree
                if lm is not None:
                    lm.resync()
            if not seq.finished:  # closed, interrupted or failed between steps
                loop.end(seq, "cancelled")
            dec._active = None
            dec._lock.release()
            # This thread may not decode again for a while: its OpenMP workers
            # would slow every other decoder's passes meanwhile (engine/openmp.py).
            dec._release_threads()

    def _pieces(self) -> Generator[str, None, None]:
        """The text the last step made.  A stream may be handed to another thread:
        the one that resumes it is the one reading it now (see ``_generate``)."""
        for piece in self.seq.take_pieces():
            yield piece
            self.thread = threading.get_ident()

    def _acquire(self, lock: threading.Lock) -> bool:
        """Take the decoder's lock; False (the sequence finished) if cancelled
        or timed out first."""
        seq = self.seq
        if seq.cancel is None and seq.deadline is None:
            lock.acquire()
            return True
        while True:
            reason = seq.stop_reason(time.perf_counter())
            if reason is not None:  # ended waiting for the decoder: counted as a request all the same
                self.dec._loop.end(seq, reason)
                return False
            wait = _LOCK_POLL
            if seq.deadline is not None:
                wait = min(wait, max(seq.deadline - time.perf_counter(), 0.0))
            if lock.acquire(timeout=wait):
                return True


def _plan_rows(dec: SpeculativeDecoder) -> int:
    """The most rows a verify pass of this decoder may hold, which the timings must cover."""
    longest = dec.gamma_max
    if dec.ngram:
        longest = max(longest, int((dec._loop.ngram_kwargs or {}).get("max_draft", 24)))
    return min(longest, GAMMA_LIMIT, dec.gamma_cap) + 1


def _check_rollback(target: CausalLM, draft: Optional[CausalLM], ngram: bool) -> None:
    """Refuse speculation with a model whose cache cannot drop a suffix.

    Every rejected draft token must be removed from both caches, and a
    recurrent or hybrid model (Mamba, RWKV, ...) folds each token into a
    state it cannot rewind.  A draft model like that can never serve: it is
    refused.  Such a target is refused too when a drafter is attached,
    rather than silently running plain: the caller asked for speculation.
    Alone (no draft model, no n-gram drafting) the same target is fine:
    plain decoding only ever appends, and a later request that does not
    extend the cached text starts the cache over (decoding/slots.py).
    """
    if draft is not None and not getattr(draft, "can_truncate", True):
        raise UnsupportedModelError(
            f"the draft model {_model_name(draft)} is a recurrent/hybrid model: its state cannot drop "
            "rejected draft tokens, so it cannot draft; use a transformer draft (or ngram drafting)")
    if (draft is not None or ngram) and not getattr(target, "can_truncate", True):
        raise UnsupportedModelError(
            f"the target model {_model_name(target)} is a recurrent/hybrid model: its state cannot "
            "drop rejected draft tokens, so it cannot be verified speculatively; load it without a "
            "draft model and without ngram (plain decoding works)")


def _model_name(model: object) -> str:
    weights = getattr(model, "weights", None)
    path, arch = getattr(weights, "path", None), getattr(weights, "architecture", None)
    if path is None:
        return type(model).__name__
    return f"{path} ({arch})" if arch else str(path)
