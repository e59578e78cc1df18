"""The speculative decoding loop: draft, verify in one target pass, roll back."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence, Union


from . import sampling
from .cache import CachedSequence
from .planning import GammaController, MatchLengthController
from .drafters import CombinedDrafter, Draft, Drafter, ModelDrafter, NgramDrafter
from .drafters.unwrap import unwrapped_reference
from .errors import DecoderClosedError, GenerationCancelled, InvalidLogitsError, UnsupportedModelError
from .model import CausalLM, Tokenizer, eog_id_array
from .params import SamplingParams
from .request_args import GAMMA_LIMIT, Prompt, chat_prompt, check_gamma, check_request, prompt_tokens
from .stats import GenerationStats
from .text import TextAssembler

GammaSetting = Union[int, str]
_LOCK_POLL = 0.05  # seconds between cancel/timeout checks while waiting for the decoder


@dataclass
class Generation:
    """The result of one generation: its text, token ids and statistics."""

    text: str
    tokens: list[int]
    stats: GenerationStats = field(repr=False)

    @property
    def finish_reason(self) -> Optional[str]:
        """``stop`` (EOG or a stop string), ``length``, ``context`` or ``cancelled``."""
        return self.stats.finish_reason


class SpeculativeDecoder:
    """Exact speculative decoding of a target model with a cheap drafter.

    Every emitted token is distributed exactly as the target's sampling
    distribution under the given ``SamplingParams``; the drafter only changes
    how many tokens one target pass yields.  ``gamma=0`` is plain decoding
    through the same engine, ``gamma="auto"`` lets the planner choose γ per step
    from measured costs and acceptance (0 where speculation cannot pay).

    One decoder holds one conversation's caches: calls are serialised by an
    internal lock, so sharing a decoder between threads is safe but not
    parallel (use ``DecoderPool`` for that).  A request waiting for the lock
    still honours its ``cancel`` and ``timeout``.

    Stopping early (``cancel``, ``timeout``, closing a stream, an exception
    such as ``InvalidLogitsError`` or ``KeyboardInterrupt``) leaves the caches
    consistent: the next call gives what a fresh decoder would.

    How far a step drafts: a fixed ``gamma`` (here or per call) is used as
    given; with ``gamma="auto"`` the draft model's γ stays within
    ``gamma_max`` and prompt lookup's within its ``max_draft``.  Every route
    is also capped at ``gamma_cap`` = the target's ``n_batch`` − 1, since a
    verify pass scores γ + 1 rows in one llama.cpp batch.

    ``seed`` seeds the decoder's own random streams (drafting and
    verification), used by requests whose ``SamplingParams.seed`` is None; a
    request with a seed starts fresh streams of its own.  A seed repeats a
    run only with the same model files, kernel ISA and CPU, a fixed γ (or
    greedy decoding) and the same cache history, e.g. a fresh or ``reset()``
    decoder: batched and one-row passes round differently, and a prompt
    prefix cached by an earlier call is not decoded again (docs/math.md §9).
    """

    def __init__(
        self,
        target: CausalLM,
        tokenizer: Tokenizer,
        draft: Optional[CausalLM] = None,
        *,
        gamma: GammaSetting = "auto",
        gamma_max: int = 12,
        seed: Optional[int] = None,
        cost_model: object = None,
        drafter: Optional[Drafter] = None,
    ) -> None:
        check_gamma(gamma)
        if not isinstance(gamma_max, int) or not 1 <= gamma_max <= GAMMA_LIMIT:
            raise ValueError(f"gamma_max must be an int in [1, {GAMMA_LIMIT}], got {gamma_max!r}")
        if isinstance(gamma, int) and gamma > gamma_max:
            gamma_max = gamma
        self.target = target
        self.draft = draft
        self.tokenizer = tokenizer
        self.gamma = gamma
        self.gamma_max = gamma_max
        self.cost_model = cost_model
        if drafter is None and draft is not None:
            # A draft cut to part of the vocabulary says which target id each of its ids is.
            source_ids = getattr(getattr(draft, "weights", None), "source_ids", None)
            drafter = ModelDrafter(draft, target.n_vocab, gamma_max, source_ids)
        self.drafter = drafter
        if self.drafter is None and gamma not in (0, "auto"):
            raise ValueError(f"gamma={gamma} needs a drafter: pass a draft model (or gamma=0)")
        _check_rollback(target, self.drafter)
        #: The largest γ one verify pass can hold: it scores γ + 1 rows in one
        #: llama.cpp batch, so every route's γ is capped at the target's n_batch − 1.
        self.gamma_cap = _verify_cap(target)
        if isinstance(gamma, int) and gamma > self.gamma_cap:
            warnings.warn(f"gamma={gamma} needs {gamma + 1} rows in one verify pass but the "
                          f"target's n_batch is {self.gamma_cap + 1}: steps use at most "
                          f"γ = {self.gamma_cap}", stacklevel=2)
        self._target_cache = CachedSequence(target)
        self._seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
        self._rng_draft = sampling.Rng(self._seed, sampling.DRAFT_STREAM)
        self._rng_verify = sampling.Rng(self._seed, sampling.VERIFY_STREAM)
        self._controllers: dict = {}  # one GammaController per draft route ("model", "ngram")
        self._lock = threading.Lock()
        self._active: Optional[_Run] = None  # the run holding the lock, if any
        self.target_path: Optional[str] = None
        self.draft_path: Optional[str] = None
        self.n_threads: Optional[int] = None
        self._owned: tuple = ()  # what close() frees besides the contexts: from_gguf's weights
        self._closed = False
        #: after a run, give back the thread's llama.cpp workers (from_gguf: engine.release_threads)
        self._release_threads: Callable[[], object] = lambda: None

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_gguf(
        cls,
        target: Union[str, os.PathLike],
        draft: Optional[Union[str, os.PathLike]] = None,
        *,
        gamma: GammaSetting = "auto",
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: Optional[int] = None,
        seed: Optional[int] = None,
        gamma_max: int = 12,
        ngram: bool = False,
        ngram_kwargs: Optional[dict] = None,
        calibration: object = "auto",
        progress: Optional[Callable[[str], None]] = None,
        draft_vocab: Optional[int] = None,
    ) -> "SpeculativeDecoder":
        """Load a target (and optionally a draft) GGUF model through llama.cpp.

        The vocabularies are checked for compatibility at load
        (``VocabMismatchError`` names the first differing ids).  ``ngram=True``
        adds prompt-lookup drafting (``NgramDrafter(**ngram_kwargs)``): alone
        without a draft model, else preferred whenever the text offers a
        continuation, with the draft model for the other steps.

        ``calibration`` seeds the γ planner: ``"auto"`` (default) uses the
        stored calibration of this pair on this machine, measuring the pass
        times first when there is none (a second or two; stored for next
        time, ``progress`` gets a line before and after); ``"cached"`` uses
        the stored one or none, never measuring; ``"measure"`` runs the full
        calibration now (timings and α at default sampling); a ``CostModel``
        is used as given; ``None`` starts from priors.  In every case the
        planner keeps refining its estimates from real steps.

        ``draft_vocab=N`` drafts with a copy of the draft cut to its first N
        ids and its control tokens (written once to the cache): cheaper draft
        passes, the same exact output (docs/math.md §10).  Byte-pair ids come
        roughly in merge order; for Qwen2.5, 98304 keeps the acceptance of
        English and code (bench/RESULTS.md, "A draft cut to its common
        vocabulary").
        """
        from . import engine  # the only place llama.cpp is touched

        check_gamma(gamma)
        if ngram_kwargs is not None and not ngram:
            raise ValueError("ngram_kwargs needs ngram=True")
        _check_calibration(calibration)
        draft = engine.cut_draft(draft, draft_vocab, progress)
        target_w = engine.LlamaWeights(target)
        draft_w = None
        try:
            if draft is not None:
                draft_w = engine.LlamaWeights(draft)
                engine.check_vocab_compatible(target_w, draft_w)
            dec = cls._from_weights(target_w, draft_w, gamma=gamma, n_ctx=n_ctx, n_batch=n_batch,
                                    n_threads=n_threads, seed=seed, gamma_max=gamma_max,
                                    ngram=ngram, ngram_kwargs=ngram_kwargs, calibration=calibration,
                                    progress=progress)
        except BaseException:
            target_w.close()
            if draft_w is not None:
                draft_w.close()
            raise
        dec._weights = (target_w, draft_w)  # keep the models alive with their contexts
        dec._owned = tuple(w for w in dec._weights if w is not None)
        return dec

    @classmethod
    def _from_weights(cls, target_w, draft_w, *, gamma: GammaSetting = "auto", n_ctx: int = 4096,
                      n_batch: int = 512, n_threads: Optional[int] = None, seed: Optional[int] = None,
                      gamma_max: int = 12, ngram: bool = False, ngram_kwargs: Optional[dict] = None,
                      calibration: object = "auto",
                      progress: Optional[Callable[[str], None]] = None) -> "SpeculativeDecoder":
        """A decoder with contexts of its own over loaded, vocabulary-checked
        ``LlamaWeights`` (which the caller keeps alive and closes)."""
        from . import engine

        drafter: Optional[Drafter] = NgramDrafter(**(ngram_kwargs or {})) if ngram else None
        target_ctx = target_w.new_context(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        draft_ctx = (draft_w.new_context(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
                     if draft_w is not None else None)
        if drafter is not None and draft_ctx is not None:
            drafter = CombinedDrafter(ModelDrafter(draft_ctx, target_ctx.n_vocab, gamma_max, draft_w.source_ids),
                                      drafter)
        dec = cls(target_ctx, engine.LlamaTokenizer(target_w), draft_ctx, gamma=gamma,
                  gamma_max=gamma_max, seed=seed, drafter=drafter)
        dec.target_path = target_w.path
        dec.draft_path = draft_w.path if draft_w is not None else None
        dec.n_threads = target_ctx.n_threads
        dec.cost_model = _initial_cost_model(dec, calibration, progress)
        dec._release_threads = engine.release_threads
        dec._release_threads()  # the calibration's passes ran on this thread
        return dec

    # ------------------------------------------------------------------ public API
    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        params: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        gamma: Optional[GammaSetting] = None,
        cancel: Optional[threading.Event] = None,
        timeout: Optional[float] = None,
    ) -> Generation:
        """Generate a continuation of ``prompt`` (text, UTF-8 bytes, or token ids).

        ``cancel`` (a ``threading.Event``) and ``timeout`` (seconds for the
        whole call, waiting for the decoder included) stop generation at the
        next step boundary; ``generate`` then raises ``GenerationCancelled``
        whose ``partial`` is the Generation so far (``finish_reason``
        ``"cancelled"`` or ``"timeout"``) and ``reason`` says which.  The
        decoder is ready for the next call either way.
        """
        run = self._run(prompt, max_tokens, params, stop, gamma, cancel, timeout)
        pieces = run.iterate()
        try:
            for _ in pieces:
                pass
        finally:
            pieces.close()  # after a KeyboardInterrupt between two steps: release the decoder now
        gen = run.result
        if gen.finish_reason in ("cancelled", "timeout"):
            what = ("cancelled by its cancel event" if gen.finish_reason == "cancelled"
                    else f"stopped by its timeout of {timeout} s")
            raise GenerationCancelled(f"generation {what} after {len(gen.tokens)} tokens",
                                      partial=gen, reason=gen.finish_reason)
        return gen

    def stream(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        params: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        gamma: Optional[GammaSetting] = None,
        cancel: Optional[threading.Event] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[str]:
        """Yield text pieces as they are accepted.

        Unlike ``generate``, a stream simply ends when ``cancel`` is set or
        ``timeout`` passes (no exception).  Once it has ended, or been closed,
        its ``result`` attribute is the Generation, whose ``finish_reason``
        says why (``"cancelled"`` also after ``close()``).  A stream holds the
        decoder's lock while it is suspended: close it (``close()``, a
        ``with`` block, or dropping the last reference) when stopping early;
        that stops generation at once and leaves the decoder ready for the
        next call.  Argument errors are raised here, not at the first piece.
        """
        return _Stream(self._run(prompt, max_tokens, params, stop, gamma, cancel, timeout))

    def chat(self, messages: Sequence[dict], **kwargs) -> Generation:
        """``generate`` on the target's chat template applied to ``messages``.

        Later turns reuse the cached common prefix of the conversation.
        """
        return self.generate(self.chat_prompt(messages), **kwargs)

    def chat_stream(self, messages: Sequence[dict], **kwargs) -> Iterator[str]:
        """``stream`` on the target's chat template applied to ``messages``."""
        return self.stream(self.chat_prompt(messages), **kwargs)

    def chat_prompt(self, messages: Sequence[dict]) -> str:
        """The target's chat template applied to ``messages``."""
        return chat_prompt(self.tokenizer, messages)

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
            for ctx in (self.target, self.draft):
                close = getattr(ctx, "close", None)  # in-process test models have nothing to free
                if close is not None:
                    close()
            for w in self._owned:
                w.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "SpeculativeDecoder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Forget the cached conversation."""
        if self._active is not None and self._active.thread == threading.get_ident():
            self._active.close()
        with self._lock:
            self._target_cache.reset()
            if self.drafter is not None:
                self.drafter.reset()

    # ------------------------------------------------------------------ the loop
    def _run(self, prompt, max_tokens, params, stop, gamma, cancel, timeout) -> "_Run":
        tokens, text, gamma = self._prepare(prompt, max_tokens, params, stop, gamma, cancel, timeout)
        return _Run(self, tokens, max_tokens, params, text, gamma, cancel, timeout)

    def _prepare(self, prompt, max_tokens, params, stop, gamma, cancel, timeout):
        """Check a request's arguments: (prompt token ids, TextAssembler, γ)."""
        if self._closed:
            raise DecoderClosedError("this SpeculativeDecoder is closed")
        if gamma is None:
            gamma = self.gamma
        check_request(max_tokens=max_tokens, params=params, gamma=gamma, has_drafter=self.drafter is not None,
                      cancel=cancel, timeout=timeout)
        tokens = prompt_tokens(prompt, self.tokenizer, self.target.n_vocab, self._context_limit())
        return tokens, TextAssembler(stop), gamma

    def _context_limit(self) -> int:
        """Tokens a sequence may hold: the smaller of the two contexts."""
        return min(self.target.n_ctx, self.draft.n_ctx if self.draft is not None else self.target.n_ctx)

    def _gamma_controller(self, route: str = "model"):
        """The γ controller of one draft route (created on first use).

        An n-gram lookup costs ~nothing and its acceptance depends on how long
        the match is: its controller (``MatchLengthController``) has c = 0 and
        learns α per match length (the calibration's draft cost and α are the
        model's).
        """
        ctrl = self._controllers.get(route)
        if ctrl is None:
            part = _parts(self.drafter, route=route)
            if isinstance(part, NgramDrafter):
                cm = (None if self.cost_model is None
                      else dataclasses.replace(self.cost_model, draft_ms=0.0, alpha=None))
                ctrl = MatchLengthController(cm, gamma_max=min(part.max_draft, GAMMA_LIMIT,
                                                               self.gamma_cap))
            else:
                ctrl = GammaController(self.cost_model,
                                       gamma_max=min(self.gamma_max, self.gamma_cap))
            self._controllers[route] = ctrl
        return ctrl


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
    """The state of one generation; ``iterate()`` runs it, yielding text
    pieces, and ``result`` is its Generation once it has ended or been closed."""

    def __init__(self, dec: SpeculativeDecoder, prompt: list[int], max_tokens: int,
                 params: SamplingParams, text: TextAssembler, gamma: GammaSetting,
                 cancel: Optional[threading.Event], timeout: Optional[float]) -> None:
        self.dec, self.prompt, self.max_tokens, self.params = dec, prompt, max_tokens, params
        self.text, self.gamma, self.cancel, self.timeout = text, gamma, cancel, timeout
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.out: list[int] = []
        self.thread: Optional[int] = None
        self.result: Optional[Generation] = None
        self.deadline = None if timeout is None else time.perf_counter() + timeout
        self.phase = "target"  # the model running, for error messages
        self._gen: Optional[weakref.ref] = None  # weak: the generator refers to us

    def iterate(self) -> Iterator[str]:
        gen = self._generate()
        self._gen = weakref.ref(gen)
        return gen

    def close(self) -> None:
        """Stop early; the decoder's caches stay consistent."""
        gen = self._gen() if self._gen is not None else None
        if gen is not None:
            gen.close()
        if self.result is None:  # closed before it started
            self._finish(None)

    def _generate(self) -> Iterator[str]:
        dec = self.dec
        active = dec._active
        if active is not None and active.thread == threading.get_ident():
            # A stream this thread left suspended: it can never resume before
            # we finish, so end it now rather than deadlock on the lock.
            active.close()
        if not self._acquire(dec._lock):
            self._finish(None)
            return
        if dec._closed:  # closed while this call waited for the lock
            dec._lock.release()
            self._finish(None)
            raise DecoderClosedError("the SpeculativeDecoder was closed while this call waited", self.result)
        try:
            dec._active, self.thread = self, threading.get_ident()
            start = time.perf_counter()
            try:
                yield from self._decode(start)
            except InvalidLogitsError as exc:
                raise InvalidLogitsError(self._logits_context(exc)) from None
            finally:
                _resync(dec._target_cache)
                for part in _parts(dec.drafter):
                    if isinstance(part, ModelDrafter):
                        _resync(part.cache)
                self._finish(start)
                dec._active = None
        finally:
            dec._lock.release()
            # This thread may not decode again for a while: its OpenMP workers
            # would slow every other decoder's passes meanwhile (engine/openmp.py).
            dec._release_threads()

    def _finish(self, start: Optional[float]) -> None:
        if start is not None:
            self.stats.total_seconds = time.perf_counter() - start
        if self.stats.finish_reason is None:
            self.stats.finish_reason = "cancelled"
        self.result = Generation(self.text.text, self.out, self.stats)

    def _stop_reason(self) -> Optional[str]:
        """``"cancelled"`` or ``"timeout"`` once the run must stop, else None."""
        if self.cancel is not None and self.cancel.is_set():
            return "cancelled"
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return "timeout"
        return None

    def _acquire(self, lock: threading.Lock) -> bool:
        """Take the decoder's lock; False if cancelled or timed out first."""
        if self.cancel is None and self.deadline is None:
            lock.acquire()
            return True
        while True:
            reason = self._stop_reason()
            if reason is not None:
                self.stats.finish_reason = reason
                return False
            wait = _LOCK_POLL
            if self.deadline is not None:
                wait = min(wait, max(self.deadline - time.perf_counter(), 0.0))
            if lock.acquire(timeout=wait):
                return True

    def _logits_context(self, exc: InvalidLogitsError) -> str:
        """Which model gave bad logits, and where (the kernel names row and token)."""
        dec = self.dec
        path = dec.target_path if self.phase == "target" else dec.draft_path
        where = f" ({path})" if path else ""
        n = self.stats.prompt_tokens + self.stats.tokens  # the first position being predicted
        if self.phase == "draft":
            return f"the draft model{where} produced invalid logits drafting from position {n} on: {exc}"
        return (f"the target model{where} produced invalid logits for positions {n} on "
                f"(row r predicts position {n} + r): {exc}")

    def _decode(self, start: float) -> Iterator[str]:
        dec, params, stats = self.dec, self.params, self.stats
        if params.seed is not None:
            rng_d = sampling.Rng(params.seed, sampling.DRAFT_STREAM)
            rng_v = sampling.Rng(params.seed, sampling.VERIFY_STREAM)
        else:
            rng_d, rng_v = dec._rng_draft, dec._rng_verify
        auto = self.gamma == "auto" and dec.drafter is not None
        if auto:
            for route in _parts(dec.drafter, names=True):
                dec._gamma_controller(route).new_sequence()
        seq = list(self.prompt)
        target = dec._target_cache
        n_ctx = dec._context_limit()
        banned = eog_id_array(dec.tokenizer, dec.target.n_vocab) if params.ignore_eos else None

        # Prompt: reuse what the cache already holds, decode the rest but the
        # last token (its logits come with the first step), a batch at a time.
        stats.prompt_cached = min(_align(target, seq), len(seq) - 1)
        chunk = getattr(dec.target, "n_batch", None) or len(seq)
        while len(target) < len(seq) - 1:
            reason = self._stop_reason()
            if reason is not None:
                stats.finish_reason = reason
                return
            target.eval(seq[len(target):min(len(target) + chunk, len(seq) - 1)], 1)
        if dec.drafter is not None:
            for part in _parts(dec.drafter):
                if isinstance(part, NgramDrafter):
                    part.set_reference(unwrapped_reference(seq, dec.tokenizer) if part.unwrap_lines else [])
            dec.drafter.begin(seq)
        stats.prompt_seconds = time.perf_counter() - start

        while True:
            reason = self._stop_reason()
            if reason is not None:
                stats.finish_reason = reason
                return
            room = n_ctx - len(seq)  # tokens the target cache can still take beyond seq[:-1]
            if room < 0:
                stats.finish_reason = "context"
                return
            remaining = self.max_tokens - stats.tokens
            gamma, route = self._choose_gamma(seq, max(0, min(remaining - 1, room)), auto)
            draft_s = 0.0
            if gamma > 0:
                self.phase = "draft"
                draft: Draft = _parts(dec.drafter, route=route).propose(seq, gamma, params, rng_d)
                gamma, draft_s = min(len(draft), gamma), draft.seconds
                self.phase = "target"
                # An empty draft (no n-gram match) falls through to a plain step.

            if gamma == 0:
                t0 = time.perf_counter()
                logits = target.sync_and_eval(seq, 1)
                if banned is not None:
                    logits = sampling.mask_tokens(logits, banned)
                t1 = time.perf_counter()
                new = [sampling.sample(logits[0], params, rng_v)]
                t2 = time.perf_counter()
                n_acc, alphas = 0, ()
            else:
                draft_tokens = draft.tokens[:gamma]
                draft_probs = None if draft.probs is None else draft.probs[:gamma]
                t0 = time.perf_counter()
                logits = target.sync_and_eval(seq + draft_tokens.tolist(), gamma + 1)
                if banned is not None:
                    logits = sampling.mask_tokens(logits, banned)
                t1 = time.perf_counter()
                res = sampling.verify(logits, draft_tokens, draft_probs, params, rng_v)
                t2 = time.perf_counter()
                n_acc, alphas = res.n_accepted, res.alphas
                new = draft_tokens[:n_acc].tolist() + [res.token]
                target.keep(len(seq) + n_acc)
                dec.drafter.rollback(len(seq) + n_acc)
                stats.drafted += gamma
                stats.accepted += n_acc
                stats.alpha_sum += float(sum(alphas))
                stats.alpha_rows += len(alphas)
                stats.record_drafter(draft.name, gamma, n_acc)
            stats.steps += 1
            stats.gammas.append(gamma)
            stats.draft_seconds += draft_s
            stats.target_seconds += t1 - t0
            stats.sampling_seconds += t2 - t1
            if auto:
                self._observe(route if gamma > 0 else None, gamma, alphas, n_acc, draft_s, t1 - t0, new[0])

            for tok in new:
                if dec.tokenizer.is_eog(tok):
                    stats.finish_reason = "stop"
                    break
                seq.append(tok)
                self.out.append(tok)
                stats.tokens += 1
                piece = self.text.feed(dec.tokenizer.token_bytes(tok))
                if piece:
                    yield piece
                if self.text.stopped:
                    stats.finish_reason = "stop"
                    break
                if stats.tokens >= self.max_tokens:
                    stats.finish_reason = "length"
                    break
            if stats.finish_reason is not None:
                tail = self.text.finish()
                if tail:
                    yield tail
                return

    def _choose_gamma(self, seq: list[int], cap: int, auto: bool) -> tuple[int, Optional[str]]:
        """(γ, route) of the next step: the first route the drafter offers
        after ``seq`` whose γ (its controller's, or the fixed one) is > 0,
        at most ``cap`` and the verify pass's limit ``gamma_cap``.  A fixed γ
        is used as given (``gamma_max`` does not bound it, as at
        construction); controllers keep to their own γ_max: ``gamma_max``
        for a draft model, ``max_draft`` for prompt lookup (whose drafts cost
        nothing, so only the target's pass limits how long they pay)."""
        dec = self.dec
        cap = min(cap, dec.gamma_cap)
        if dec.drafter is None or cap <= 0:
            return 0, None
        routes = dec.drafter.routes(seq) if hasattr(dec.drafter, "routes") else (dec.drafter.name,)
        for route in routes:
            if not auto:
                g = int(self.gamma)
            else:
                ctrl = dec._gamma_controller(route)
                if isinstance(ctrl, MatchLengthController):
                    m = _parts(dec.drafter, route=route).match(seq)
                    g = ctrl.next_gamma(m.length, m.token, m.unanimous) if m else 0
                else:
                    g = ctrl.next_gamma()
            if g > 0:
                return min(g, cap), route
        return 0, None

    def _observe(self, route: Optional[str], gamma: int, alphas, n_acc: int,
                 draft_s: float, target_s: float, first_token: int) -> None:
        """A drafted step teaches its route's controller; a plain step (its
        T(1)) teaches them all; a route that predicted the first emitted
        token without drafting it learns whether it was right."""
        for name, ctrl in self.dec._controllers.items():
            if route is None:
                ctrl.observe(0, (), 0, draft_s, target_s)
            elif name == route:
                ctrl.observe(gamma, alphas, n_acc, draft_s, target_s)
            else:
                ctrl.draft_fell_behind()
            ctrl.emitted(first_token)


def _parts(drafter: Optional[Drafter], *, names: bool = False, route: Optional[str] = None):
    """The drafters behind ``drafter`` (one, or a CombinedDrafter's routes):
    their route names with ``names``, or the one drafting ``route``."""
    parts = getattr(drafter, "drafters", None)
    if route is not None:
        return parts[route] if parts is not None else drafter
    if parts is None:
        parts = {} if drafter is None else {drafter.name: drafter}
    return list(parts) if names else list(parts.values())


def _check_calibration(calibration: object) -> None:
    from .planning import CostModel

    if not (calibration is None or isinstance(calibration, CostModel)
            or calibration in ("auto", "cached", "measure")):
        raise ValueError("calibration must be 'auto', 'cached', 'measure', a CostModel or None, "
                         f"got {calibration!r}")


def _initial_cost_model(dec: SpeculativeDecoder, calibration: object,
                        progress: Optional[Callable[[str], None]] = None) -> object:
    from .planning.calibration import calibrate, starting_costs

    if calibration == "measure":
        return calibrate(dec) if dec.draft is not None else None
    if dec.drafter is None:
        return calibration if not isinstance(calibration, str) else None  # nothing to plan
    return starting_costs(calibration, target=dec.target, draft=dec.draft, target_path=dec.target_path,
                          draft_path=dec.draft_path, n_threads=dec.n_threads, k_max=_plan_rows(dec),
                          progress=progress)


def _plan_rows(dec: SpeculativeDecoder) -> int:
    """The most rows a verify pass of this decoder may hold (γ_max + 1 over
    its routes), which the timings must cover."""
    longest = dec.gamma_max
    for part in _parts(dec.drafter):
        if isinstance(part, NgramDrafter):
            longest = max(longest, part.max_draft)
    return min(longest, GAMMA_LIMIT, dec.gamma_cap) + 1


def _verify_cap(target: CausalLM) -> int:
    """The most draft tokens one verify pass of ``target`` can score: the pass
    needs γ + 1 rows of logits from one batch of at most ``n_batch`` rows.  A
    model without a batch limit (a synthetic one) allows GAMMA_LIMIT."""
    n_batch = getattr(target, "n_batch", None)
    if n_batch is None:
        return GAMMA_LIMIT
    return max(0, min(GAMMA_LIMIT, int(n_batch) - 1))


def _check_rollback(target: CausalLM, drafter: Optional[Drafter]) -> None:
    """Refuse speculation with a model whose cache cannot drop a suffix.

    Every rejected draft token must be removed from both caches, and a
    recurrent or hybrid model (Mamba, RWKV, ...) folds each token into a
    state it cannot rewind.  A draft model like that can never serve: it is
    refused.  Such a target is refused too when a drafter is attached,
    rather than silently running plain: the caller asked for speculation,
    which cannot happen, and finding out at load beats a slow run that looks
    like a bad draft (or, before this check, a failure at the first
    rejection).  Alone (no draft model, no n-gram drafting) the same target
    is fine: plain decoding only ever appends, and a later request that does
    not extend the cached text starts the cache over (see ``_align``).
    """
    if drafter is None:
        return
    for part in _parts(drafter):
        if isinstance(part, ModelDrafter) and not getattr(part.cache.model, "can_truncate", True):
            raise UnsupportedModelError(
                f"the draft model {_model_name(part.cache.model)} is a recurrent/hybrid model: its "
                "state cannot drop rejected draft tokens, so it cannot draft; use a transformer "
                "draft (or ngram drafting)")
    if not getattr(target, "can_truncate", True):
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


def _align(cache: CachedSequence, seq: Sequence[int]) -> int:
    """``cache.align(seq)`` that also serves a model unable to drop a suffix
    (a recurrent target decoding plain): its cache is kept only when ``seq``
    extends it by at least one token (the first step evaluates ``seq``'s last
    token); otherwise it starts over.  Returns the tokens kept."""
    if getattr(cache.model, "can_truncate", True):
        return cache.align(seq)
    n = cache.common_prefix(seq)
    if n < len(cache) or n >= len(seq):
        cache.reset()
        return 0
    return n


def _resync(cache: CachedSequence) -> None:
    """After a stop or an error, make a cache's mirror and its model agree.

    An interruption inside ``CachedSequence.keep`` can leave the model shorter
    than the mirror (truncated, mirror not yet cut); inside ``eval``, longer.
    """
    n = cache.model.n_past
    if n < len(cache.tokens):
        del cache.tokens[n:]
    cache.resync()
