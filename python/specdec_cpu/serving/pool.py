"""DecoderPool: parallel requests over one copy of the model weights."""

from __future__ import annotations

import os
import queue
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence, Union

from ..decoder import _LOCK_POLL, Generation, SpeculativeDecoder, _check_calibration
from ..request_args import Prompt, check_gamma
from ..errors import GenerationCancelled
from ..stats import GenerationStats

__all__ = ["DecoderPool"]

_FROM_GGUF_KWARGS = {"gamma", "n_ctx", "n_batch", "n_threads", "seed", "gamma_max", "ngram",
                     "ngram_kwargs", "calibration", "draft_vocab"}


class DecoderPool:
    """``size`` speculative decoders over shared weights, for parallel requests.

    Each model file is loaded once (one ``LlamaWeights``: one llama.cpp model,
    memory-mapped); each of the ``size`` decoders has contexts (KV caches) of
    its own over those weights.  A request takes an idle decoder, waiting for
    one when all are busy, so at most ``size`` requests run at once.  Their
    llama.cpp passes release the GIL and run in parallel: give each decoder a
    share of the cores (``n_threads`` ≈ cores / size).

    ``from_gguf_kwargs`` are those of ``SpeculativeDecoder.from_gguf``
    (``gamma``, ``n_ctx``, ``n_threads``, ``ngram``, ``calibration``, ...).
    With ``seed``, decoder ``i`` draws from ``seed + i`` (requests that need
    reproducible output pass ``SamplingParams(seed=...)``, which gives the
    same tokens whichever decoder serves them).  A calibration is looked up
    or measured once and shared.

    Usage::

        with DecoderPool(4, "target.gguf", "draft.gguf", n_threads=2) as pool:
            gen = pool.generate("Hello", max_tokens=64)      # from any thread
            for piece in pool.stream("Hi"):
                ...
            with pool.acquire() as dec:                      # several calls, one decoder
                dec.chat(messages)

    ``generate``/``stream``/``chat`` take the decoder methods' arguments and
    honour ``cancel`` and ``timeout`` while waiting for a decoder too (the
    timeout covers waiting and generating).  A decoder keeps its caches
    between requests, but requests are not pinned to decoders: a follow-up
    turn may land on a decoder that has to process its prompt afresh.
    """

    def __init__(self, size: int, target: Union[str, "os.PathLike[str]"],
                 draft: Optional[Union[str, "os.PathLike[str]"]] = None, **from_gguf_kwargs) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1 (the number of decoders), got {size!r}")
        from .. import engine

        kwargs = dict(from_gguf_kwargs)
        unknown = set(kwargs) - _FROM_GGUF_KWARGS
        if unknown:
            raise TypeError(f"DecoderPool got unexpected keyword argument(s) {', '.join(sorted(unknown))}; "
                            f"it takes those of SpeculativeDecoder.from_gguf: {', '.join(sorted(_FROM_GGUF_KWARGS))}")
        check_gamma(kwargs.get("gamma", "auto"))
        if kwargs.get("ngram_kwargs") is not None and not kwargs.get("ngram"):
            raise ValueError("ngram_kwargs needs ngram=True")
        _check_calibration(kwargs.get("calibration", "cached"))
        seed = kwargs.pop("seed", None)
        draft = engine.cut_draft(draft, kwargs.pop("draft_vocab", None))

        self._closed = False
        self._state = threading.Lock()
        self._idle: "queue.LifoQueue[SpeculativeDecoder]" = queue.LifoQueue()
        self._decoders: list[SpeculativeDecoder] = []
        self._weights: list = []
        try:
            target_w = engine.LlamaWeights(target)
            self._weights.append(target_w)
            draft_w = None
            if draft is not None:
                draft_w = engine.LlamaWeights(draft)
                self._weights.append(draft_w)
                engine.check_vocab_compatible(target_w, draft_w)
            for i in range(size):
                dec_seed = seed if seed is None or i == 0 else (seed + i) % 2**64
                dec = SpeculativeDecoder._from_weights(target_w, draft_w, seed=dec_seed, **kwargs)
                dec._weights = (target_w, draft_w)
                if i == 0:  # calibrate (or look the calibration up) once
                    kwargs["calibration"] = dec.cost_model
                self._decoders.append(dec)
        except BaseException:
            for w in self._weights:
                w.close()
            raise
        for dec in reversed(self._decoders):
            self._idle.put(dec)

    # ------------------------------------------------------------------ info
    @property
    def size(self) -> int:
        """Number of decoders (the most requests that run at once)."""
        return len(self._decoders)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def tokenizer(self):
        """The target's tokenizer (shared by every decoder's vocabulary)."""
        return self._decoders[0].tokenizer

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._idle.qsize()} idle"
        return f"DecoderPool(size={self.size}, {self._decoders[0].target_path!r}, {state})"

    # ------------------------------------------------------------------ requests
    def generate(self, prompt: Prompt, *, cancel: Optional[threading.Event] = None,
                 timeout: Optional[float] = None, **kwargs) -> Generation:
        """``SpeculativeDecoder.generate`` on an idle decoder (waiting for one).

        Raises ``GenerationCancelled`` (with ``partial``) on ``cancel`` or
        ``timeout``, whether the request was waiting or generating.
        """
        tokens = self._check(prompt, cancel, timeout, kwargs)
        deadline = None if timeout is None else time.perf_counter() + timeout
        dec = self._take(cancel, deadline)
        try:
            return dec.generate(tokens, cancel=cancel, timeout=_remaining(deadline), **kwargs)
        finally:
            self._give_back(dec)

    def stream(self, prompt: Prompt, *, cancel: Optional[threading.Event] = None,
               timeout: Optional[float] = None, **kwargs) -> "_PooledStream":
        """``SpeculativeDecoder.stream`` on an idle decoder.

        The stream takes a decoder at its first piece and gives it back when
        it ends or is closed; like a decoder's stream it ends quietly on
        ``cancel``/``timeout`` and has ``result`` once over.  Close it when
        stopping early, or the decoder stays taken until it is collected.
        """
        tokens = self._check(prompt, cancel, timeout, kwargs)
        deadline = None if timeout is None else time.perf_counter() + timeout
        return _PooledStream(self, tokens, cancel, deadline, kwargs)

    def chat(self, messages: Sequence[dict], **kwargs) -> Generation:
        """``generate`` on the target's chat template applied to ``messages``."""
        return self.generate(self.chat_prompt(messages), **kwargs)

    def chat_stream(self, messages: Sequence[dict], **kwargs) -> "_PooledStream":
        """``stream`` on the target's chat template applied to ``messages``."""
        return self.stream(self.chat_prompt(messages), **kwargs)

    def chat_prompt(self, messages: Sequence[dict]) -> str:
        """The target's chat template applied to ``messages``."""
        self._require_open()
        return self._decoders[0].chat_prompt(messages)

    @contextmanager
    def acquire(self, timeout: Optional[float] = None,
                cancel: Optional[threading.Event] = None) -> Iterator[SpeculativeDecoder]:
        """Borrow one decoder for several calls (e.g. a conversation).

        Raises ``TimeoutError`` if none is free within ``timeout`` seconds and
        ``GenerationCancelled`` if ``cancel`` is set while waiting.  A stream
        left open on the decoder is closed when it is given back.
        """
        if timeout is not None:
            _check_timeout(timeout)
        deadline = None if timeout is None else time.perf_counter() + timeout
        try:
            dec = self._take(cancel, deadline)
        except GenerationCancelled as exc:
            if exc.reason == "timeout":
                raise TimeoutError(f"no decoder of the pool became free within {timeout} s") from None
            raise
        try:
            yield dec
        finally:
            self._give_back(dec)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Wait for the requests in flight, then free every context and the
        weights.  Idempotent; later requests raise ``ValueError``."""
        with self._state:
            if self._closed:
                return
            self._closed = True
        for _ in self._decoders:  # every decoder back: no request is running
            self._idle.get()
        for w in self._weights:
            w.close()

    def __enter__(self) -> "DecoderPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _require_open(self) -> None:
        if self._closed:
            raise ValueError("DecoderPool is closed")

    def _check(self, prompt, cancel, timeout, kwargs) -> list[int]:
        """Validate a request before it waits: its prompt as token ids."""
        self._require_open()
        unknown = set(kwargs) - {"max_tokens", "params", "stop", "gamma"}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        dec = self._decoders[0]  # any decoder: they are alike (tokenizing is read-only)
        defaults = {"max_tokens": 256, "params": None, "stop": (), "gamma": None}
        args = {**defaults, **kwargs}
        if args["params"] is None:
            from ..params import SamplingParams

            args["params"] = SamplingParams()
        tokens, _, _ = dec._prepare(prompt, args["max_tokens"], args["params"], args["stop"],
                                    args["gamma"], cancel, timeout)
        return tokens

    def _take(self, cancel: Optional[threading.Event], deadline: Optional[float]) -> SpeculativeDecoder:
        """An idle decoder; GenerationCancelled on cancel or timeout first."""
        while True:
            self._require_open()
            reason = _stop_reason(cancel, deadline)
            if reason is not None:
                what = "cancelled" if reason == "cancelled" else "timed out"
                raise GenerationCancelled(f"request {what} while waiting for a free decoder",
                                          partial=_empty(reason), reason=reason)
            wait = _LOCK_POLL if deadline is None else min(_LOCK_POLL, max(deadline - time.perf_counter(), 0.0))
            try:
                dec = self._idle.get(timeout=wait) if wait > 0 else self._idle.get_nowait()
            except queue.Empty:
                continue
            if self._closed:  # close() is collecting the decoders
                self._idle.put(dec)
                self._require_open()
            return dec

    def _give_back(self, dec: SpeculativeDecoder) -> None:
        run = dec._active
        if run is not None:  # a stream left open on a borrowed decoder
            try:
                run.close()
            except ValueError:  # it is running in another thread: that thread ends it
                pass
        self._idle.put(dec)


class _PooledStream:
    """A decoder stream run on a pool's decoder, taken at the first piece.

    Only the caller refers to it (its generator writes to a separate
    ``_Outcome``), so dropping it gives the decoder back at once."""

    def __init__(self, pool: DecoderPool, tokens: list[int], cancel: Optional[threading.Event],
                 deadline: Optional[float], kwargs: dict) -> None:
        self._outcome = _Outcome()
        self._gen = _pooled_stream(pool, tokens, cancel, deadline, kwargs, self._outcome)

    def __iter__(self) -> "_PooledStream":
        return self

    def __next__(self) -> str:
        return next(self._gen)

    @property
    def result(self) -> Optional[Generation]:
        """The Generation once the stream has ended or been closed."""
        return self._outcome.result

    def close(self) -> None:
        """Stop early and give the decoder back."""
        self._gen.close()
        if self._outcome.result is None:
            self._outcome.result = _empty("cancelled")

    def __enter__(self) -> "_PooledStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Outcome:
    result: Optional[Generation] = None


def _pooled_stream(pool: DecoderPool, tokens: list[int], cancel: Optional[threading.Event],
                   deadline: Optional[float], kwargs: dict, outcome: _Outcome) -> Iterator[str]:
    try:
        dec = pool._take(cancel, deadline)
    except GenerationCancelled as exc:
        outcome.result = exc.partial
        return
    try:
        run = dec.stream(tokens, cancel=cancel, timeout=_remaining(deadline), **kwargs)
        try:
            yield from run
        finally:
            run.close()
            outcome.result = run.result
    finally:
        pool._give_back(dec)


def _stop_reason(cancel: Optional[threading.Event], deadline: Optional[float]) -> Optional[str]:
    if cancel is not None and cancel.is_set():
        return "cancelled"
    if deadline is not None and time.perf_counter() >= deadline:
        return "timeout"
    return None


def _remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left before ``deadline`` (a tiny positive number once past:
    the decoder then stops before its first step)."""
    if deadline is None:
        return None
    return max(deadline - time.perf_counter(), 1e-9)


def _check_timeout(timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def _empty(reason: str) -> Generation:
    """The Generation of a request that never ran."""
    return Generation("", [], GenerationStats(finish_reason=reason))
