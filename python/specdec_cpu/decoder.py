"""The speculative decoding loop: draft, verify in one target pass, roll back."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence, Union

from . import sampling
from .cache import CachedSequence
from .drafters import CombinedDrafter, Draft, Drafter, ModelDrafter, NgramDrafter
from .errors import ContextOverflowError
from .model import CausalLM, Tokenizer
from .params import SamplingParams
from .stats import GenerationStats
from .text import TextAssembler

GammaSetting = Union[int, str]
GAMMA_LIMIT = 64


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
    parallel (use ``DecoderPool`` for that).
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
        _check_gamma(gamma)
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
            drafter = ModelDrafter(draft, target.n_vocab, gamma_max)
        self.drafter = drafter
        if self.drafter is None and gamma not in (0, "auto"):
            raise ValueError(f"gamma={gamma} needs a drafter: pass a draft model (or gamma=0)")
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
    ) -> "SpeculativeDecoder":
        """Load a target (and optionally a draft) GGUF model through llama.cpp.

        The vocabularies are checked for compatibility at load
        (``VocabMismatchError`` names the first differing ids).  ``ngram=True``
        adds prompt-lookup drafting (``NgramDrafter(**ngram_kwargs)``): alone
        without a draft model, else preferred whenever the text offers a
        continuation, with the draft model for the other steps.
        """
        from . import engine  # the only place llama.cpp is touched

        _check_gamma(gamma)
        if ngram_kwargs is not None and not ngram:
            raise ValueError("ngram_kwargs needs ngram=True")
        drafter: Optional[Drafter] = NgramDrafter(**(ngram_kwargs or {})) if ngram else None
        target_w = engine.LlamaWeights(target)
        draft_w = None
        try:
            if draft is not None:
                draft_w = engine.LlamaWeights(draft)
                engine.check_vocab_compatible(target_w, draft_w)
            target_ctx = target_w.new_context(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
            draft_ctx = (draft_w.new_context(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
                         if draft_w is not None else None)
        except BaseException:
            target_w.close()
            if draft_w is not None:
                draft_w.close()
            raise
        if drafter is not None and draft_ctx is not None:
            drafter = CombinedDrafter(ModelDrafter(draft_ctx, target_ctx.n_vocab, gamma_max), drafter)
        dec = cls(target_ctx, engine.LlamaTokenizer(target_w), draft_ctx, gamma=gamma,
                  gamma_max=gamma_max, seed=seed, drafter=drafter)
        dec._weights = (target_w, draft_w)  # keep the models alive with their contexts
        dec.target_path, dec.draft_path = os.fspath(target), (os.fspath(draft) if draft else None)
        dec.n_threads = target_ctx.n_threads
        return dec

    # ------------------------------------------------------------------ public API
    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        max_tokens: int = 256,
        params: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        gamma: Optional[GammaSetting] = None,
        cancel: Optional[threading.Event] = None,
        timeout: Optional[float] = None,
    ) -> Generation:
        """Generate a continuation of ``prompt`` (text, or token ids)."""
        run = self._run(prompt, max_tokens, params, stop, gamma, cancel, timeout)
        for _ in run:
            pass
        return run.result  # type: ignore[attr-defined]

    def stream(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        max_tokens: int = 256,
        params: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        gamma: Optional[GammaSetting] = None,
        cancel: Optional[threading.Event] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[str]:
        """Yield text pieces as they are accepted.  Closing the iterator stops
        generation and leaves the decoder ready for the next call."""
        return iter(self._run(prompt, max_tokens, params, stop, gamma, cancel, timeout))

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
        text = self.tokenizer.chat_prompt(messages, add_generation_prompt=True)
        if text is None:
            raise ValueError("the target model has no chat template; use generate() with a raw prompt")
        return text

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
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if gamma is None:
            gamma = self.gamma
        _check_gamma(gamma)
        if self.drafter is None and gamma not in (0, "auto"):
            raise ValueError(f"gamma={gamma} needs a drafter: this decoder has none")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        tokens = self._prompt_tokens(prompt)
        return _Run(self, tokens, max_tokens, params, TextAssembler(stop), gamma, cancel, timeout)

    def _prompt_tokens(self, prompt: Union[str, Sequence[int]]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            tokens = self.tokenizer.tokenize(prompt, add_special=True, parse_special=True)
        else:
            tokens = [int(t) for t in prompt]
            bad = [t for t in tokens if not 0 <= t < self.target.n_vocab]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.target.n_vocab})")
        if not tokens:
            raise ValueError("prompt is empty")
        limit = min(self.target.n_ctx, self.draft.n_ctx if self.draft is not None else self.target.n_ctx)
        if len(tokens) > limit:
            raise ContextOverflowError(
                f"prompt is {len(tokens)} tokens but the context holds {limit}; "
                "shorten the prompt or raise n_ctx")
        return tokens

    def _gamma_controller(self, route: str = "model"):
        """The γ controller of one draft route (created on first use).

        An n-gram lookup costs ~nothing: its controller starts from c = 0 and
        learns its own α (the calibration's draft cost and α are the model's).
        """
        ctrl = self._controllers.get(route)
        if ctrl is None:
            from .planner import GammaController

            if route == NgramDrafter.name:
                cm = (None if self.cost_model is None
                      else dataclasses.replace(self.cost_model, draft_ms=0.0, alpha=None))
                ctrl = GammaController(cm, gamma_max=self.gamma_max, cost_prior=0.0)
            else:
                ctrl = GammaController(self.cost_model, gamma_max=self.gamma_max)
            self._controllers[route] = ctrl
        return ctrl


class _Run:
    """One generation as an iterator of text pieces; ``result`` when done."""

    def __init__(self, dec: SpeculativeDecoder, prompt: list[int], max_tokens: int,
                 params: SamplingParams, text: TextAssembler, gamma: GammaSetting,
                 cancel: Optional[threading.Event], timeout: Optional[float]) -> None:
        self.dec, self.prompt, self.max_tokens, self.params = dec, prompt, max_tokens, params
        self.text, self.gamma, self.cancel, self.timeout = text, gamma, cancel, timeout
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.out: list[int] = []
        self.thread: Optional[int] = None
        self.result: Optional[Generation] = None
        self._gen = self._generate()

    def __iter__(self) -> "_Run":
        return self

    def __next__(self) -> str:
        return next(self._gen)

    def close(self) -> None:
        """Stop early; the decoder's caches stay consistent."""
        self._gen.close()

    def _generate(self) -> Iterator[str]:
        dec = self.dec
        active = dec._active
        if active is not None and active.thread == threading.get_ident():
            # A stream this thread left suspended: it can never resume before
            # we finish, so end it now rather than deadlock on the lock.
            active.close()
        with dec._lock:
            dec._active, self.thread = self, threading.get_ident()
            start = time.perf_counter()
            try:
                yield from self._decode(start)
            finally:
                dec._target_cache.resync()
                for part in _parts(dec.drafter):
                    if isinstance(part, ModelDrafter):
                        part.cache.resync()
                self.stats.total_seconds = time.perf_counter() - start
                if self.stats.finish_reason is None:
                    self.stats.finish_reason = "cancelled"
                self.result = Generation(self.text.text, self.out, self.stats)
                dec._active = None

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
        n_ctx = dec.target.n_ctx

        # Prompt: reuse what the cache already holds, decode the rest but the
        # last token (its logits come with the first step).
        stats.prompt_cached = min(target.align(seq), len(seq) - 1)
        if len(target) < len(seq) - 1:
            target.eval(seq[len(target):-1], 1)
        if dec.drafter is not None:
            dec.drafter.begin(seq)
        stats.prompt_seconds = time.perf_counter() - start
        deadline = None if self.timeout is None else start + self.timeout

        while True:
            if self.cancel is not None and self.cancel.is_set():
                stats.finish_reason = "cancelled"
                return
            if deadline is not None and time.perf_counter() > deadline:
                stats.finish_reason = "timeout"
                return
            room = n_ctx - len(seq)  # tokens the target cache can still take beyond seq[:-1]
            if room < 0:
                stats.finish_reason = "context"
                return
            remaining = self.max_tokens - stats.tokens
            gamma, route = self._choose_gamma(seq, max(0, min(remaining - 1, room, dec.gamma_max)), auto)
            draft_s = 0.0
            if gamma > 0:
                draft: Draft = _parts(dec.drafter, route=route).propose(seq, gamma, params, rng_d)
                gamma, draft_s = min(len(draft), gamma), draft.seconds
                # An empty draft (no n-gram match) falls through to a plain step.

            if gamma == 0:
                t0 = time.perf_counter()
                logits = target.sync_and_eval(seq, 1)
                t1 = time.perf_counter()
                new = [sampling.sample(logits[0], params, rng_v)]
                t2 = time.perf_counter()
                n_acc, alphas = 0, ()
            else:
                draft_tokens = draft.tokens[:gamma]
                draft_probs = None if draft.probs is None else draft.probs[:gamma]
                t0 = time.perf_counter()
                logits = target.sync_and_eval(seq + draft_tokens.tolist(), gamma + 1)
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
                self._observe(route if gamma > 0 else None, gamma, alphas, n_acc, draft_s, t1 - t0)

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
        after ``seq`` whose γ (its controller's, or the fixed one) is > 0."""
        dec = self.dec
        if dec.drafter is None or cap <= 0:
            return 0, None
        routes = dec.drafter.routes(seq) if hasattr(dec.drafter, "routes") else (dec.drafter.name,)
        for route in routes:
            g = dec._gamma_controller(route).next_gamma() if auto else int(self.gamma)
            if g > 0:
                return min(g, cap), route
        return 0, None

    def _observe(self, route: Optional[str], gamma: int, alphas, n_acc: int,
                 draft_s: float, target_s: float) -> None:
        """A drafted step teaches its route's controller; a plain step (its
        T(1)) teaches them all."""
        for name, ctrl in self.dec._controllers.items():
            if route is None:
                ctrl.observe(0, (), 0, draft_s, target_s)
            elif name == route:
                ctrl.observe(gamma, alphas, n_acc, draft_s, target_s)
            else:
                ctrl.new_sequence()  # its drafter fell behind: its next draft time includes catching up


def _parts(drafter: Optional[Drafter], *, names: bool = False, route: Optional[str] = None):
    """The drafters behind ``drafter`` (one, or a CombinedDrafter's routes):
    their route names with ``names``, or the one drafting ``route``."""
    parts = getattr(drafter, "drafters", None)
    if route is not None:
        return parts[route] if parts is not None else drafter
    if parts is None:
        parts = {} if drafter is None else {drafter.name: drafter}
    return list(parts) if names else list(parts.values())


def _check_gamma(gamma: object) -> None:
    if gamma == "auto":
        return
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 0 <= gamma <= GAMMA_LIMIT:
        raise ValueError(f"gamma must be 'auto' or an int in [0, {GAMMA_LIMIT}], got {gamma!r}")
