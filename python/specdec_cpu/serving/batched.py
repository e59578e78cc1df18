"""BatchedDecoder: exact speculative decoding of many requests in one llama.cpp pass per step."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Callable, Optional, Sequence, Union

from .. import sampling
from ..decoder import Generation
from ..engine.multi_context import LlamaMultiContext, SequenceView
from ..drafters import NgramDrafter
from ..errors import DecoderClosedError, GenerationCancelled
from ..model import Tokenizer
from ..params import SamplingParams
from ..planning.batch_planner import BatchPlanner
from ..planning.calibration import BATCH_ROWS, starting_costs
from ..planning.costmodel import CostModel
from ..request_args import GAMMA_LIMIT, Prompt, chat_prompt, check_gamma, check_request, prompt_tokens
from ..text import TextAssembler
from .metrics import MetricsSnapshot, ServingMetrics
from .request import AsyncRequestStream, Request, RequestStream
from .scheduler import Scheduler
from .step_trace import StepTrace

__all__ = ["BatchedDecoder"]

GammaSetting = Union[int, str]


class BatchedDecoder:
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
    plain continuous batching (γ = 0) as the batch fills up.

    Requests beyond ``max_sequences`` wait in a FIFO of at most
    ``max_queue`` (``QueueFullError`` beyond); waiting requests honour their
    ``cancel`` and ``timeout``.  A request that finishes, is cancelled, times
    out or fails frees its sequence at once; one request's bad logits never
    disturb the others.  Prompt prefixes cached by earlier requests (a
    conversation's earlier turns, a shared system prompt) are reused.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, target: LlamaMultiContext, tokenizer: Tokenizer, draft: Optional[LlamaMultiContext] = None,
                 *, gamma: GammaSetting = "auto", gamma_max: int = 12, ngram: bool = False,
                 ngram_kwargs: Optional[dict] = None, seed: Optional[int] = None, max_queue: int = 64,
                 prefill_chunk: int = 128, cost_model: Optional[CostModel] = None,
                 step_trace: Optional[StepTrace] = None) -> None:
        _check_settings(gamma=gamma, gamma_max=gamma_max, max_queue=max_queue, prefill_chunk=prefill_chunk,
                        ngram=ngram, ngram_kwargs=ngram_kwargs, has_drafter=draft is not None or ngram)
        if draft is not None and draft.n_seq != target.n_seq:
            raise ValueError(f"target and draft contexts must hold as many sequences ({target.n_seq} != {draft.n_seq})")
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.gamma, self.gamma_max = gamma, max(gamma_max, gamma if isinstance(gamma, int) else 0)
        # A verify pass needs γ + 1 rows and every sequence at least one.
        self.gamma_max = min(self.gamma_max, target.n_batch - 1)
        self.cost_model = cost_model
        self._has_drafter = draft is not None or ngram
        self._seed = int.from_bytes(os.urandom(8), "little") if seed is None else int(seed)
        self._seed_lock = threading.Lock()
        self._requests = 0
        self._closed = False
        self._weights: tuple = ()
        self.target_path: Optional[str] = target.weights.path
        self.draft_path: Optional[str] = draft.weights.path if draft is not None else None
        self._metrics = ServingMetrics(max_sequences=target.n_seq)
        planner = BatchPlanner(cost_model, max_rows=target.n_batch,
                               max_draft_rows=draft.n_batch if draft is not None else 1)
        ngram_args = (dict(ngram_kwargs or {}) if ngram else None)
        self._scheduler = Scheduler(
            target=target, draft=draft, tokenizer=tokenizer, planner=planner, metrics=self._metrics,
            max_queue=max_queue, prefill_chunk=prefill_chunk, gamma_max=self.gamma_max, ngram_kwargs=ngram_args,
            alpha_prior=cost_model.alpha if cost_model is not None else None,
            step_trace=step_trace)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_gguf(
        cls,
        target: Union[str, os.PathLike],
        draft: Optional[Union[str, os.PathLike]] = None,
        *,
        max_sequences: int = 8,
        n_ctx: int = 4096,
        gamma: GammaSetting = "auto",
        gamma_max: int = 12,
        ngram: bool = False,
        ngram_kwargs: Optional[dict] = None,
        n_threads: Optional[int] = None,
        n_batch: int = 512,
        seed: Optional[int] = None,
        max_queue: int = 64,
        prefill_chunk: int = 128,
        calibration: object = "auto",
        progress: Optional[Callable[[str], None]] = None,
        step_trace: Optional[StepTrace] = None,
        draft_vocab: Optional[int] = None,
    ) -> "BatchedDecoder":
        """Load a target (and optionally a draft) GGUF model for batched serving.

        Args:
            max_sequences: requests decoded at once (llama.cpp sequences).
            n_ctx: the most tokens one request may hold (prompt + output);
                the KV cache has room for ``n_ctx × max_sequences`` tokens.
            n_batch: the most rows of one pass (prompt chunks, drafts and
                every request's rows together); one micro-batch, one pass.
            prefill_chunk: prompt tokens processed per step while other
                requests are decoding (a long prompt is taken in chunks so
                the others keep streaming; alone, a prompt goes in at once).
            calibration: ``"auto"`` (the stored calibration of this pair and
                machine; on first use the pass times are measured first, a
                few seconds, and stored), ``"cached"`` (stored or none, never
                measuring), a ``CostModel``, or None (priors, learnt online).
            progress: receives a line before and after a first-use
                measurement (a command line prints them).
            step_trace: called with a ``StepRecord`` after every step (the
                planner's predictions beside what happened; step_trace.py).
            draft_vocab: draft with the draft cut to its first N ids (and
                control tokens): cheaper draft passes, the same exact output.
            The rest are those of ``SpeculativeDecoder.from_gguf``.
        """
        from .. import engine

        _check_settings(gamma=gamma, gamma_max=gamma_max, max_queue=max_queue, prefill_chunk=prefill_chunk,
                        ngram=ngram, ngram_kwargs=ngram_kwargs, has_drafter=draft is not None or ngram)
        if not (calibration is None or isinstance(calibration, CostModel) or calibration in ("auto", "cached")):
            raise ValueError(f"calibration must be 'auto', 'cached', a CostModel or None, got {calibration!r}")
        if isinstance(max_sequences, bool) or not isinstance(max_sequences, int) or not 1 <= max_sequences <= 256:
            raise ValueError(f"max_sequences must be an int in [1, 256], got {max_sequences!r}")
        draft = engine.cut_draft(draft, draft_vocab, progress)
        target_w = engine.LlamaWeights(target)
        draft_w = None
        contexts: list = []
        try:
            if draft is not None:
                draft_w = engine.LlamaWeights(draft)
                engine.check_vocab_compatible(target_w, draft_w)
            target_ctx = LlamaMultiContext(target_w, n_seq=max_sequences, n_ctx=n_ctx, n_batch=n_batch,
                                           n_threads=n_threads)
            contexts.append(target_ctx)
            draft_ctx = None
            if draft_w is not None:
                draft_ctx = LlamaMultiContext(draft_w, n_seq=max_sequences, n_ctx=n_ctx, n_batch=n_batch,
                                              n_threads=n_threads)
                contexts.append(draft_ctx)
            cost_model = starting_costs(
                calibration, target=SequenceView(target_ctx, 0),
                draft=SequenceView(draft_ctx, 0) if draft_ctx is not None else None,
                target_path=target_w.path, draft_path=draft_w.path if draft_w else None,
                # (at most half a sequence's context: the timing runs after a warm prefix)
                n_threads=target_ctx.n_threads, k_max=min(BATCH_ROWS, n_batch, n_ctx // 2),
                b_max=min(max(max_sequences, prefill_chunk), n_batch, n_ctx // 2),  # draft batches, catch-ups
                progress=progress)
            # The calibration ran on this thread; from now on the scheduler's thread decodes.
            engine.release_threads()
            dec = cls(target_ctx, engine.LlamaTokenizer(target_w), draft_ctx, gamma=gamma, gamma_max=gamma_max,
                      ngram=ngram, ngram_kwargs=ngram_kwargs, seed=seed, max_queue=max_queue,
                      prefill_chunk=prefill_chunk, cost_model=cost_model, step_trace=step_trace)
        except BaseException:
            for ctx in contexts:
                ctx.close()
            target_w.close()
            if draft_w is not None:
                draft_w.close()
            raise
        dec._weights = (target_w, draft_w)
        return dec

    # ------------------------------------------------------------------ requests
    def generate(self, prompt: Prompt, *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
                 stop: Sequence[str] = (), gamma: Optional[GammaSetting] = None,
                 cancel: Optional[threading.Event] = None, timeout: Optional[float] = None) -> Generation:
        """Generate a continuation of ``prompt``; see ``SpeculativeDecoder.generate``.

        A fixed ``gamma`` above the decoder's ``gamma_max`` drafts
        ``gamma_max`` tokens a step (a request's q rows and the plans of a
        shared step are sized by it; ``SpeculativeDecoder`` takes up to
        ``n_batch − 1``).

        Raises ``QueueFullError`` when ``max_queue`` requests already wait,
        ``GenerationCancelled`` (with ``partial``) on ``cancel``/``timeout``,
        ``DecoderClosedError`` when the decoder is closed meanwhile.
        """
        req = self._submit(prompt, max_tokens, params, stop, gamma, cancel, timeout)
        try:
            req.done.wait()
        except BaseException:  # e.g. KeyboardInterrupt while waiting: the request must not run on
            req.closed = True
            raise
        if req.error is not None:
            raise req.error
        gen = req.result
        assert gen is not None
        if gen.finish_reason in ("cancelled", "timeout"):
            what = ("cancelled by its cancel event" if gen.finish_reason == "cancelled"
                    else f"stopped by its timeout of {timeout} s")
            raise GenerationCancelled(f"generation {what} after {len(gen.tokens)} tokens",
                                      partial=gen, reason=gen.finish_reason)
        return gen

    def stream(self, prompt: Prompt, *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
               stop: Sequence[str] = (), gamma: Optional[GammaSetting] = None,
               cancel: Optional[threading.Event] = None, timeout: Optional[float] = None) -> RequestStream:
        """Yield text pieces as they are accepted; see ``SpeculativeDecoder.stream``.

        The stream ends quietly on ``cancel``/``timeout`` (``result`` says
        why); closing or dropping it frees the request's sequence at the next
        step.  Argument errors and ``QueueFullError`` are raised here.
        """
        return RequestStream(self._submit(prompt, max_tokens, params, stop, gamma, cancel, timeout))

    def astream(self, prompt: Prompt, *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
                stop: Sequence[str] = (), gamma: Optional[GammaSetting] = None,
                cancel: Optional[threading.Event] = None, timeout: Optional[float] = None) -> AsyncRequestStream:
        """``stream`` for asyncio code: an async iterator of text pieces
        (call it in a running event loop; no thread blocks on the request).

        ``await s.wait()`` then ``s.result`` gives the whole Generation;
        ``await s.aclose()`` stops the request without waiting.
        """
        loop = asyncio.get_running_loop()
        return AsyncRequestStream(self._submit(prompt, max_tokens, params, stop, gamma, cancel, timeout), loop)

    def chat(self, messages: Sequence[dict], **kwargs) -> Generation:
        """``generate`` on the target's chat template applied to ``messages``."""
        return self.generate(self.chat_prompt(messages), **kwargs)

    def chat_stream(self, messages: Sequence[dict], **kwargs) -> RequestStream:
        """``stream`` on the target's chat template applied to ``messages``."""
        return self.stream(self.chat_prompt(messages), **kwargs)

    def chat_prompt(self, messages: Sequence[dict]) -> str:
        """The target's chat template applied to ``messages``."""
        return chat_prompt(self.tokenizer, messages)

    def tokenize(self, prompt: Prompt) -> list[int]:
        """The token ids a request with this prompt would decode (checked
        as a request's prompt is: ``InvalidPromptError``, ``ContextOverflowError``)."""
        return prompt_tokens(prompt, self.tokenizer, self.target.n_vocab, self.n_ctx)

    # ------------------------------------------------------------------ state
    @property
    def max_sequences(self) -> int:
        """Requests decoded at once."""
        return self.target.n_seq

    @property
    def n_ctx(self) -> int:
        """The most tokens one request may hold (prompt + output)."""
        return min(self.target.n_ctx, self.draft.n_ctx) if self.draft is not None else self.target.n_ctx

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def healthy(self) -> bool:
        """Open, and its scheduler thread running."""
        return not self._closed and self._scheduler.alive

    def metrics(self) -> MetricsSnapshot:
        """Counters since the decoder started: requests by outcome, tokens,
        drafts, passes, queue depth, active sequences, prompt-cache hits."""
        return self._metrics.snapshot()

    def close(self, *, drain: bool = False, timeout: Optional[float] = None) -> None:
        """Stop taking requests and free the models (idempotent).

        With ``drain`` the requests queued or running may finish first (for
        at most ``timeout`` seconds); whatever is left then (everything,
        without ``drain``) ends with ``DecoderClosedError``.  Never hangs on
        a request whose caller went away.
        """
        if self._closed:
            return
        self._closed = True
        self._scheduler.close(drain=drain, timeout=timeout)
        for ctx in (self.target, self.draft):
            if ctx is not None:
                ctx.close()
        for w in self._weights:
            if w is not None:
                w.close()

    def __enter__(self) -> "BatchedDecoder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        m = self._metrics
        state = "closed" if self._closed else f"{m.active_sequences} active, {m.queue_depth} waiting"
        return f"BatchedDecoder({self.target_path!r}, max_sequences={self.max_sequences}, {state})"

    # ------------------------------------------------------------------ internals
    def _submit(self, prompt, max_tokens, params, stop, gamma, cancel, timeout) -> Request:
        if self._closed:
            raise DecoderClosedError("BatchedDecoder is closed")
        if gamma is None:
            gamma = self.gamma
        check_request(max_tokens=max_tokens, params=params, gamma=gamma, has_drafter=self._has_drafter,
                      cancel=cancel, timeout=timeout)
        if isinstance(gamma, int):
            gamma = min(gamma, self.gamma_max) if gamma > 0 else 0
        tokens = self.tokenize(prompt)
        text = TextAssembler(stop)
        seed = params.seed if params.seed is not None else self._next_seed()
        req = Request(tokens, max_tokens=max_tokens, params=params, stop=text, gamma=gamma, cancel=cancel,
                      timeout=timeout, rng_draft=sampling.Rng(seed, sampling.DRAFT_STREAM),
                      rng_verify=sampling.Rng(seed, sampling.VERIFY_STREAM), n_vocab=self.target.n_vocab,
                      gamma_rows=min(self.gamma_max, 16))
        self._scheduler.submit(req)
        return req

    def _next_seed(self) -> int:
        """Each request without a seed of its own gets the next of a sequence
        derived from the decoder's seed (SplitMix64), so a seeded decoder
        given the same requests in the same order draws the same numbers."""
        with self._seed_lock:
            self._requests += 1
            z = (self._seed + 0x9E3779B97F4A7C15 * self._requests) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        return z ^ (z >> 31)


def _check_settings(*, gamma: GammaSetting, gamma_max: int, max_queue: int, prefill_chunk: int, ngram: bool,
                    ngram_kwargs: Optional[dict], has_drafter: bool) -> None:
    """Raise ValueError, naming the argument, for a setting the decoder cannot
    run with: checked before any model is loaded."""
    check_gamma(gamma)
    if isinstance(gamma_max, bool) or not isinstance(gamma_max, int) or not 1 <= gamma_max <= GAMMA_LIMIT:
        raise ValueError(f"gamma_max must be an int in [1, {GAMMA_LIMIT}], got {gamma_max!r}")
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
        raise ValueError(f"max_queue must be an int >= 0, got {max_queue!r}")
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
        raise ValueError(f"prefill_chunk must be an int >= 1, got {prefill_chunk!r}")
    if ngram_kwargs is not None and not ngram:
        raise ValueError("ngram_kwargs needs ngram=True")
    if ngram:
        NgramDrafter(**(ngram_kwargs or {}))  # its own ValueError names a bad setting
    if not has_drafter and gamma not in (0, "auto"):
        raise ValueError(f"gamma={gamma} needs a drafter: pass a draft model, ngram=True, or gamma=0")
