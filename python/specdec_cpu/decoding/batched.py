"""BatchedDecoder: exact speculative decoding of many requests in one llama.cpp pass per step."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import threading
from typing import Any, Callable, Optional, Union
from typing import Sequence as Seq

from ..core.protocols import Tokenizer
from ..core.request_args import Prompt
from ..core.sequence import GammaSetting, SeedSequence, choice_seed
from ..core.stats import Generation
from ..core.text import stop_strings
from ..errors import UnsupportedModelError
from ..params import SamplingParams
from ..planning.costmodel import CostModel
from ..planning.policy import CATCH_UP_LIMIT
from ..settings import BatchedSettings
from .embeddings import Embedder, EmbeddingCounts
from .front import CallerCalls, DecoderFront, generation_or_raise, make_policy, settings_of
from .loop import StepLoop
from .metrics import MetricsSnapshot, ServingMetrics
from .request import AsyncRequestStream, Request, RequestStream
from .scheduler import Scheduler
from .step_trace import StepTrace

__all__ = ["BatchedDecoder"]


class BatchedDecoder(DecoderFront):
    """Many concurrent requests, each sampled exactly from the target's
    distribution, sharing every target pass.

    The calls are those of :class:`~specdec_cpu.SpeculativeDecoder` (same
    arguments, same return types), and they are thread-safe *and* parallel:
    each request gets a sequence of one target context (and one draft
    context) holding ``max_sequences`` sequences, and a scheduler thread runs
    steps in which every request's rows go through ONE target ``llama_decode``.
    On a memory-bound target a pass over many rows costs little more than
    over one, so concurrent requests share the weights' memory traffic; the
    planner spends the rows left over on drafts, and falls back towards
    plain continuous batching (γ = 0) as the batch fills up.  With one
    request it is what ``SpeculativeDecoder`` is: the same step loop.

    Requests beyond ``max_sequences`` wait in a FIFO of at most
    ``max_queue`` (``QueueFullError`` beyond); waiting requests honour their
    ``cancel`` and ``timeout``.  A request that finishes, is cancelled, times
    out or fails frees its sequence at once; one request's bad logits never
    disturb the others.  Prompt prefixes cached by earlier requests (a
    conversation's earlier turns, a shared system prompt) are reused.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, target: Any, tokenizer: Tokenizer, draft: Any = None, *, gamma: GammaSetting = "auto",
                 gamma_max: int = 12, ngram: bool = False, ngram_kwargs: Optional[dict] = None,
                 seed: Optional[int] = None, max_queue: int = 64, prefill_chunk: int = 128,
                 cost_model: Optional[CostModel] = None, step_trace: Optional[StepTrace] = None) -> None:
        s = BatchedSettings(gamma=gamma, gamma_max=gamma_max, ngram=ngram, ngram_kwargs=ngram_kwargs, seed=seed,
                            max_queue=max_queue, prefill_chunk=prefill_chunk, calibration=None,
                            max_sequences=target.n_seq)
        s.check_drafter(draft is not None)
        if draft is not None and draft.n_seq != target.n_seq:
            raise ValueError(f"target and draft contexts must hold as many sequences ({target.n_seq} != {draft.n_seq})")
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self._target_lm = target
        self.gamma = gamma
        # A verify pass needs γ + 1 rows and every sequence at least one.
        self.gamma_max = min(max(gamma_max, gamma if isinstance(gamma, int) else 0), target.n_batch - 1)
        self.cost_model = cost_model
        self.ngram = ngram
        self._has_drafter = draft is not None or ngram
        self._seeds = SeedSequence(seed)
        self._closed = False
        self._calls = CallerCalls("BatchedDecoder")
        self._owned: Any = None
        self._embedder: Optional[Embedder] = None  # from_gguf gives it one
        self.target_path: Optional[str] = target.weights.path
        self.draft_path: Optional[str] = draft.weights.path if draft is not None else None
        self.n_threads: Optional[int] = target.n_threads
        self._metrics = ServingMetrics(max_sequences=target.n_seq)
        loop = StepLoop(
            target=target, draft=draft, tokenizer=tokenizer,
            policy=self._policy(cost_model),
            prefill_chunk=prefill_chunk, ngram_kwargs=dict(ngram_kwargs or {}) if ngram else None,
            metrics=self._metrics, step_trace=step_trace,
            draft_source_ids=draft.weights.source_ids if draft is not None else None,
            names=(self.target_path or "", self.draft_path or ""))
        self._scheduler = Scheduler(loop, max_queue=max_queue)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_gguf(cls, target: Union[str, os.PathLike], draft: Optional[Union[str, os.PathLike]] = None, *,
                  settings: Optional[BatchedSettings] = None, progress: Optional[Callable[[str], None]] = None,
                  step_trace: Optional[StepTrace] = None, **kwargs: Any) -> "BatchedDecoder":
        """Load a target (and optionally a draft) GGUF model for batched serving.

        The settings are a ``BatchedSettings`` or its fields as keywords:
        those of ``SpeculativeDecoder.from_gguf`` and

        - ``max_sequences``: requests decoded at once (llama.cpp sequences);
          the KV cache has room for ``n_ctx × max_sequences`` tokens;
        - ``max_queue``: requests that may wait for a free sequence;
        - ``prefill_chunk``: prompt tokens taken in per step while other
          requests are decoding (a long prompt goes in chunks so the others
          keep streaming; alone, a prompt goes in at once).

        ``n_batch`` bounds the rows of one pass (prompt chunks, drafts and
        every request's rows together).  ``calibration="measure"`` measures
        the pair's costs for ``max_sequences`` requests and α now.
        ``progress`` receives a line before and after a first-use measurement;
        ``step_trace`` is called with a ``StepRecord`` after every step (the
        planner's predictions beside what happened; step_trace.py).
        """
        from .. import engine

        s = settings_of(settings, kwargs, BatchedSettings)
        s.check_drafter(draft is not None)
        # an embedding model first: a missing file fails before the pair loads
        own_embedding = engine.LlamaWeights(s.embedding_model) if s.embedding_model is not None else None
        try:
            dec = cls._load(target, draft, s, own_embedding, progress, step_trace)
        except BaseException:
            if own_embedding is not None:
                own_embedding.close()
            raise
        return dec

    @classmethod
    def _load(cls, target: Union[str, os.PathLike], draft: Optional[Union[str, os.PathLike]], s: BatchedSettings,
              own_embedding: Any, progress: Optional[Callable[[str], None]],
              step_trace: Optional[StepTrace]) -> "BatchedDecoder":
        from .. import engine
        from ..planning.calibration import BATCH_ROWS, initial_costs

        pair = engine.load_pair(target, draft, draft_vocab=s.draft_vocab, progress=progress)
        with pair.closed_on_error():
            target_ctx = engine.LlamaMultiContext(pair.target, n_seq=s.max_sequences, n_ctx=s.n_ctx,
                                                  n_batch=s.n_batch, n_threads=s.n_threads)
            draft_ctx = None
            if pair.draft is not None:
                draft_ctx = engine.LlamaMultiContext(pair.draft, n_seq=s.max_sequences, n_ctx=s.n_ctx,
                                                     n_batch=s.n_batch, n_threads=s.n_threads)
            dec = cls(target_ctx, engine.LlamaTokenizer(pair.target), draft_ctx, gamma=s.gamma,
                      gamma_max=s.gamma_max, ngram=s.ngram, ngram_kwargs=s.ngram_kwargs, seed=s.seed,
                      max_queue=s.max_queue, prefill_chunk=s.prefill_chunk, step_trace=step_trace)
            dec._owned = pair
            dec._embedder = Embedder(
                own_embedding or pair.target, dec.tokenizer if own_embedding is None else
                engine.LlamaTokenizer(own_embedding), dec._calls, max_tokens=s.embedding_max_tokens,
                n_threads=s.n_threads, owned=own_embedding is not None)
            if own_embedding is not None:
                dec._embedder.prepare()  # a model that cannot embed fails the load, not a request
            dec.set_chat_template(s.chat_template)
            if dec.has_drafter:
                # (at most half a sequence's context: the timing runs after a warm prefix)
                view = engine.SequenceView
                dec._set_cost_model(initial_costs(
                    dec, s.calibration, k_max=min(BATCH_ROWS, s.n_batch, s.n_ctx // 2),
                    b_max=min(max(s.max_sequences, s.prefill_chunk), s.n_batch, s.n_ctx // 2),
                    target=view(target_ctx, 0), draft=view(draft_ctx, 0) if draft_ctx is not None else None,
                    progress=progress))
            # The calibration ran on this thread; from now on the scheduler's thread decodes.
            engine.release_threads()
        return dec

    def _set_cost_model(self, cost_model: Optional[CostModel]) -> None:
        """Plan from ``cost_model`` (while no request is in flight: at load)."""
        self.cost_model = cost_model
        self._scheduler.loop.policy = self._policy(cost_model)

    def _policy(self, cost_model: Optional[CostModel]) -> Any:
        # A probe or a fixed γ takes in its draft's lag within one draft pass: no more than the pass holds.
        draft = self.draft
        return make_policy(cost_model, self.target, draft, gamma_max=self.gamma_max,
                           catch_up_limit=min(CATCH_UP_LIMIT, draft.n_batch - 1) if draft is not None else 0)

    # ------------------------------------------------------------------ requests
    def generate(self, prompt: Prompt, *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
                 stop: Optional[Seq[str]] = (), gamma: Optional[GammaSetting] = None,
                 cancel: Optional[threading.Event] = None, timeout: Optional[float] = None,
                 grammar: Any = None, logprobs: Optional[int] = None, logprob_mode: str = "model",
                 prompt_logprobs: Optional[int] = None) -> Generation:
        """Generate a continuation of ``prompt``; see ``SpeculativeDecoder.generate``.

        A fixed ``gamma`` above the decoder's ``gamma_max`` drafts
        ``gamma_max`` tokens a step (a request's q rows and the plans of a
        shared step are sized by it; ``SpeculativeDecoder`` takes up to
        ``n_batch − 1``).

        Raises ``QueueFullError`` when ``max_queue`` requests already wait,
        ``GenerationCancelled`` (with ``partial``) on ``cancel``/``timeout``,
        ``DecoderClosedError`` when the decoder is closed meanwhile.
        """
        req = self._submit(prompt, max_tokens, params, stop, gamma, cancel, timeout, grammar=grammar,
                           logprobs=logprobs, logprob_mode=logprob_mode,
                           prompt_logprobs=prompt_logprobs)
        return self._wait(req, timeout)

    def _wait(self, req: Request, timeout: Optional[float]) -> Generation:
        try:
            req.done.wait()
        except BaseException:  # e.g. KeyboardInterrupt while waiting: the request must not run on
            req.closed = True
            raise
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return generation_or_raise(req.result, timeout)

    def stream(self, prompt: Prompt, *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
               stop: Optional[Seq[str]] = (), gamma: Optional[GammaSetting] = None,
               cancel: Optional[threading.Event] = None, timeout: Optional[float] = None,
               grammar: Any = None, logprobs: Optional[int] = None, logprob_mode: str = "model",
               prompt_logprobs: Optional[int] = None) -> RequestStream:
        """Yield text pieces as they are accepted; see ``SpeculativeDecoder.stream``.

        The stream ends quietly on ``cancel``/``timeout`` (``result`` says
        why); closing or dropping it frees the request's sequence at the next
        step.  Argument errors and ``QueueFullError`` are raised here.
        """
        return RequestStream(self._submit(prompt, max_tokens, params, stop, gamma, cancel, timeout, grammar=grammar,
                                          logprobs=logprobs, logprob_mode=logprob_mode,
                                          prompt_logprobs=prompt_logprobs))

    def astream(self, prompt: Prompt, *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
                stop: Optional[Seq[str]] = (), gamma: Optional[GammaSetting] = None,
                cancel: Optional[threading.Event] = None, timeout: Optional[float] = None,
                grammar: Any = None, logprobs: Optional[int] = None, logprob_mode: str = "model",
                prompt_logprobs: Optional[int] = None) -> AsyncRequestStream:
        """``stream`` for asyncio code: an async iterator of text pieces
        (call it in a running event loop; no thread blocks on the request).

        ``await s.wait()`` then ``s.result`` gives the whole Generation;
        ``await s.aclose()`` stops the request without waiting.
        """
        loop = asyncio.get_running_loop()
        return AsyncRequestStream(self._submit(prompt, max_tokens, params, stop, gamma, cancel, timeout,
                                               grammar=grammar, logprobs=logprobs, logprob_mode=logprob_mode,
                                               prompt_logprobs=prompt_logprobs), loop)

    # ------------------------------------------------------------------ n choices
    def generate_choices(self, prompt: Prompt, n: int, **kwargs: Any) -> list[Generation]:
        """``n`` independent continuations of ``prompt`` (OpenAI's ``n``),
        decoded together; keyword arguments as for :meth:`generate`.

        The prompt is decoded once: the other choices start when it is in,
        sharing its cached cells (no second prefill; with ``prompt_logprobs``
        they are the first choice's).  Choice i > 0 of a
        request with a seed samples from a seed derived from it and i, so
        the choices differ and a rerun repeats them."""
        timeout = kwargs.get("timeout")
        reqs = self._submit_choices(prompt, n, kwargs)
        try:
            return [self._wait(req, timeout) for req in reqs]
        except BaseException:  # one choice failed, or the wait was interrupted: none runs on
            for req in reqs:
                req.closed = True
            raise

    def stream_choices(self, prompt: Prompt, n: int, **kwargs: Any) -> list[RequestStream]:
        """:meth:`generate_choices` as ``n`` streams (keyword arguments as for :meth:`stream`)."""
        return [RequestStream(req) for req in self._submit_choices(prompt, n, kwargs)]

    def astream_choices(self, prompt: Prompt, n: int, **kwargs: Any) -> list[AsyncRequestStream]:
        """:meth:`generate_choices` as ``n`` async streams (keyword arguments as for :meth:`astream`)."""
        loop = asyncio.get_running_loop()
        return [AsyncRequestStream(req, loop) for req in self._submit_choices(prompt, n, kwargs)]

    # ------------------------------------------------------------------ state
    @property
    def max_sequences(self) -> int:
        """Requests decoded at once."""
        return self.target.n_seq

    @property
    def max_requests(self) -> int:
        """The most requests that can run and wait at once (more are refused as
        a full queue however idle the decoder)."""
        return self.max_sequences + self._scheduler.max_queue

    @property
    def max_choices(self) -> int:
        """The most choices (OpenAI's ``n``) of one request: four per sequence,
        and no more than can run and wait at once."""
        return min(4 * self.max_sequences, self.max_requests)

    @property
    def n_ctx(self) -> int:
        """The most tokens one request may hold (prompt + output)."""
        return min(self.target.n_ctx, self.draft.n_ctx) if self.draft is not None else self.target.n_ctx

    @property
    def embeddings(self) -> Embedder:
        """Embeddings beside generation: by the ``embedding_model`` setting's model, else by the target's
        own hidden states, mean-pooled (``UnsupportedModelError`` for a decoder not loaded from GGUF files)."""
        if self._embedder is None:
            raise UnsupportedModelError("this decoder was not loaded from GGUF files: it has no model to embed with")
        return self._embedder

    def embedding_counts(self) -> EmbeddingCounts:
        """What :attr:`embeddings` has done (zeros before its first call, or without one)."""
        return self._embedder.counts() if self._embedder is not None else EmbeddingCounts(0, 0, 0.0)

    @property
    def healthy(self) -> bool:
        """Open, and its scheduler thread running."""
        return not self._closed and self._scheduler.alive

    @property
    def policy(self) -> Any:
        """The draft policy planning every step (its ``estimates()`` are α̂ and the pass times)."""
        return self._scheduler.loop.policy

    def metrics(self) -> MetricsSnapshot:
        """Counters since the decoder started: requests by outcome, tokens,
        drafts, passes, queue depth, active sequences, prompt-cache hits."""
        return self._metrics.snapshot()

    def reset(self) -> None:
        """Nothing to forget between calls (cached prompt prefixes only ever
        save work); here so that a calibration can treat both decoders alike."""

    def close(self, *, drain: bool = False, timeout: Optional[float] = None) -> None:
        """Stop taking requests and free the models (idempotent).

        With ``drain`` the requests queued or running may finish first (for
        at most ``timeout`` seconds); whatever is left then (everything,
        without ``drain``) ends with ``DecoderClosedError``.  Never hangs on
        a request whose caller went away.
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout >= 0):
            raise ValueError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        if self._closed:
            return
        self._closed = True
        self._scheduler.close(drain=drain, timeout=timeout)
        self._calls.close()  # a caller still tokenizing (or embedding) finishes first
        if self._embedder is not None:
            self._embedder.close()
        for ctx in (self.target, self.draft):
            if ctx is not None:
                ctx.close()
        if self._owned is not None:
            self._owned.close()

    def __del__(self) -> None:
        # Dropped without close(): its scheduler thread holds the models, not this object; stop it
        # (not at interpreter exit, when joining a frozen daemon thread would hang).
        if not getattr(self, "_closed", True) and not sys.is_finalizing():
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing may escape a finalizer
                pass

    def __repr__(self) -> str:
        m = self._metrics
        state = "closed" if self._closed else f"{m.active_sequences} active, {m.queue_depth} waiting"
        return f"BatchedDecoder({self.target_path!r}, max_sequences={self.max_sequences}, {state})"

    # ------------------------------------------------------------------ internals
    def _submit(self, prompt, max_tokens, params, stop, gamma, cancel, timeout, **options: Any) -> Request:
        req = self._sequence(Request, prompt, max_tokens, params, stop, gamma, cancel, timeout, self.gamma_max,
                             **options)
        # The seed is drawn once the request is accepted: a refused one uses none.
        self._scheduler.submit([req], on_accept=self._seed_of)
        return req

    def _submit_choices(self, prompt: Prompt, n: int, kwargs: dict) -> list[Request]:
        """The ``n`` requests of one prompt: the first, then the others
        waiting for its prompt to be in (``Request.after``); all or none."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.max_choices:
            raise ValueError(f"n must be an int in [1, {self.max_choices}] (choices: {self.max_sequences} "
                             f"sequences decoded at once, {self._scheduler.max_queue} waiting), got {n!r}")
        unknown = set(kwargs) - {"max_tokens", "params", "stop", "gamma", "cancel", "timeout", "grammar",
                                 "logprobs", "logprob_mode", "prompt_logprobs"}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        params = kwargs.get("params", SamplingParams())
        stop = stop_strings(kwargs.get("stop", ()))  # an iterator is read once, for every choice
        options = {k: kwargs[k] for k in ("grammar", "logprobs", "logprob_mode", "prompt_logprobs") if k in kwargs}
        reqs: list[Request] = []
        for i in range(n):
            p = params if i == 0 or params.seed is None else dataclasses.replace(
                params, seed=choice_seed(params.seed, i))
            req = self._sequence(Request, prompt, kwargs.get("max_tokens", 256), p, stop, kwargs.get("gamma"),
                                 kwargs.get("cancel"), kwargs.get("timeout"), self.gamma_max, **options)
            req.after = reqs[0] if reqs else None
            reqs.append(req)
        self._scheduler.submit(reqs, on_accept=self._seed_of)  # all or none: a refusal draws no seed
        return reqs
